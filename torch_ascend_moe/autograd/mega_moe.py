"""Backward of ``mega_moe`` (BF16 mode): the op is the unfused pipeline of our ops, each with its own autograd
formula (straight-through at the BF16 roundings, as those ops' formulas are; the clamp passes gradient inside its
bounds). FP8 x FP4 mode: quantized operands carry no gradient (train in BF16, serve in FP8 x FP4).

Two ways to the same gradients:

* eager (``_Taped``): the forward runs the pipeline once with autograd on, keeping the L1 output
  (``pipeline(keep_l1=True)``: the same values as the fused L1 + SwiGLU op), and the backward replays that tape, as
  ``nn.MoE``'s separate ops do: nothing is recomputed;
* traced (``torch.compile``, ``torch.export``, fake tensors): the op is one node whose kernel returns only its
  outputs (DeepGEMM's fused kernel where installed), so ``_backward`` recomputes the pipeline from the saved inputs
  with autograd on and differentiates it.
"""

from __future__ import annotations

import types

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad

OP = "mega_moe"
_DIFFERENTIABLE = ("x", "topk_weights", "l1_weights", "l2_weights", "shared_l1_weights", "shared_l2_weights")


def _setup(ctx, inputs, output):
    args = arguments(OP, inputs)
    # Every non-tensor argument (group, clamp, timeout; the scales, None in the differentiable BF16 mode).
    ctx.options = {name: v for name, v in vars(args).items() if not isinstance(v, torch.Tensor)}
    ctx.fp8 = args.x.dtype == torch.float8_e4m3fn
    ctx.save_for_backward(args.topk_idx, *(getattr(args, name) for name in _DIFFERENTIABLE))


def _leaves(tensors, needs) -> dict:
    """The differentiable inputs as detached leaves (requiring grad where a gradient is wanted), by name."""
    return {
        name: None if t is None else t.detach().requires_grad_(n) for name, t, n in zip(_DIFFERENTIABLE, tensors, needs)
    }


def _grads(y, leaves: dict, needs, grad_y, retain_graph: bool = False) -> tuple:
    """Every input's gradient (``gradients``' tuple) from a recorded pipeline output ``y``."""
    wanted = [name for name, n in zip(_DIFFERENTIABLE, needs) if n]
    grads = torch.autograd.grad(y, [leaves[n] for n in wanted], grad_y, allow_unused=True, retain_graph=retain_graph)
    return gradients(
        OP,
        **{
            name: torch.zeros_like(leaves[name]) if g is None else g.to(leaves[name].dtype)
            for name, g in zip(wanted, grads)
        },
    )


def _backward(ctx, grad_y, grad_counts):
    from torch_ascend_moe.backends.portable.mega_moe import pipeline

    needs = [needs_grad(ctx, OP, name) for name in _DIFFERENTIABLE]
    if ctx.fp8 or grad_y is None or not any(needs):
        return gradients(OP)
    idx, *saved = ctx.saved_tensors
    leaves = _leaves(saved, needs)
    with torch.enable_grad():
        # The same arguments with the saved leaves (scales None: BF16 mode is the differentiable one).
        y, _ = pipeline(types.SimpleNamespace(**{**ctx.options, **leaves, "topk_idx": idx}))
        return _grads(y, leaves, needs, grad_y)


def _keep_graph() -> bool:
    """Whether the running backward keeps its graph (``retain_graph=True``): the tape must then outlive it too.
    Without the engine's answer (another torch) it is kept, which is always correct."""
    keep = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    return True if keep is None else keep()


class _Taped(torch.autograd.Function):
    """An eager BF16 ``mega_moe`` that needs a gradient: the pipeline recorded once, its tape replayed by the
    backward (module docstring)."""

    @staticmethod
    def forward(ctx, *inputs):
        from torch_ascend_moe.backends.portable.mega_moe import validated_pipeline

        args = arguments(OP, inputs)
        ctx.needs = [getattr(args, name) is not None and getattr(args, name).requires_grad for name in _DIFFERENTIABLE]
        leaves = _leaves([getattr(args, name) for name in _DIFFERENTIABLE], ctx.needs)
        with torch.enable_grad():
            y, counts = validated_pipeline(types.SimpleNamespace(**{**vars(args), **leaves}), keep_l1=True)
        ctx.tape = (y, leaves)
        ctx.mark_non_differentiable(counts)
        return y.detach(), counts

    @staticmethod
    def backward(ctx, grad_y, grad_counts):
        if ctx.tape is None:
            raise RuntimeError(
                "ascend_moe::mega_moe: trying to backward through the graph a second time (its recorded steps were "
                "freed by the first backward); pass retain_graph=True the first time"
            )
        y, leaves = ctx.tape
        keep = _keep_graph()
        if not keep:
            ctx.tape = None  # the tape's buffers go with this backward, as a graph's saved tensors do
        return _grads(y, leaves, ctx.needs, grad_y, retain_graph=keep)


def _eager(*inputs):
    """``_Taped`` for an eager BF16 call (``_registry.autograd``'s ``eager``); None leaves FP8 x FP4 calls, which
    carry no gradient, to torch.library's formula."""
    if arguments(OP, inputs).x.dtype == torch.float8_e4m3fn:
        return None
    return _Taped.apply(*inputs)


autograd(OP, _backward, _setup, eager=_eager)
