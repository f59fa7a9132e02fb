"""Backward of ``mega_moe`` (BF16 mode): the op is the unfused pipeline of our ops, each with its own autograd
formula (straight-through at the BF16 roundings, as those ops' formulas are; the clamp passes gradient inside its
bounds). FP8 x FP4 mode: quantized operands carry no gradient (train in BF16, serve in FP8 x FP4).

Two ways to the same gradients:

* eager (``_Taped``): the forward runs the pipeline once with autograd on, keeping the L1 output
  (``pipeline(keep_l1=True)``: the same values as the fused L1 + SwiGLU op), and the backward replays that tape, as
  ``nn.MoE``'s separate ops do: nothing is recomputed. On CPU the routed experts' weight gradients are formed here
  (``ExpertTape``), each into the buffer of the previous step's once nothing else holds it, rather than by the
  GEMMs' backward into fresh memory (the same kernel and bits; see ``_BUFFERS``);
* traced (``torch.compile``, ``torch.export``, fake tensors): the op is one node whose kernel returns only its
  outputs (DeepGEMM's fused kernel where installed), so ``_backward`` recomputes the pipeline from the saved inputs
  with autograd on and differentiates it.
"""

from __future__ import annotations

import threading
import types

import torch
from torch.utils.weak import WeakIdKeyDictionary

from torch_ascend_moe import _C
from torch_ascend_moe._registry import _plain_call, arguments, autograd, gradients, needs_grad
from torch_ascend_moe.backends.portable.mega_moe import ExpertTape

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


# The routed experts' GEMMs an ``ExpertTape`` may take the weight gradient of: (weight, the tape's flag for it, the
# GEMM's output and input on the tape). dW[e] = the sum over expert e's rows of d(output)^T input: the k-grouped
# GEMM the GEMMs' own backward (autograd/grouped.py) calls, the same kernel and bits, written into a reused buffer.
_TAPED_GEMMS = (("l1_weights", "l1", "h", "permuted"), ("l2_weights", "l2", "y", "act"))


def _grads(y, leaves: dict, needs, grad_y, retain_graph: bool = False, tape=None, weights=None) -> tuple:
    """Every input's gradient (``gradients``' tuple) from a recorded pipeline output ``y``; the weight gradients a
    ``tape`` (``ExpertTape``) took are formed from the gradients reaching its GEMM outputs, into
    ``_gradient_buffer``s of ``weights`` (by name, as passed to the op)."""
    taken = [gemm for gemm in _TAPED_GEMMS if tape is not None and getattr(tape, gemm[1])]
    names = {name for name, *_ in taken}
    wanted = [name for name, n in zip(_DIFFERENTIABLE, needs) if n and name not in names]
    inputs = [leaves[n] for n in wanted] + [getattr(tape, output) for _, _, output, _ in taken]
    grads = torch.autograd.grad(y, inputs, grad_y, allow_unused=True, retain_graph=retain_graph)
    result = {
        name: torch.zeros_like(leaves[name]) if g is None else g.to(leaves[name].dtype)
        for name, g in zip(wanted, grads)
    }
    for (name, _, _, operand), grad in zip(taken, grads[len(wanted) :]):
        weight = weights[name]
        out = _gradient_buffer(weight)
        if grad is None:
            result[name] = out.zero_()
        else:
            result[name] = _C._k_grouped_bf16_gemm_into(out, grad, getattr(tape, operand), tape.offs, weight.shape[0])
    return gradients(OP, **result)


# The routed experts' weight gradients of eager CPU training, by weight (as passed to the op): the storage of the
# last one formed. The next backward writes into it when nothing else holds it any more (the step's gradient was
# released, ``zero_grad(set_to_none=True)``, or added into an existing ``.grad`` and dropped): a fresh [E, 2I, H]
# tensor is fresh pages, above glibc's mmap threshold (32 MiB) every step (8192 page faults, 13-15 ms on the bench
# VM, a fifth of an nn.MegaMoE training step). Held while the weight lives (one gradient's memory per weight, as a
# kept ``.grad`` is); ``release_gradient_buffers()`` drops them.
_BUFFERS = WeakIdKeyDictionary()
_BUFFERS_LOCK = threading.Lock()


def _gradient_buffer(weight: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor of ``weight``'s shape and dtype to write its gradient into: the last one's storage when
    this module holds the only reference to it, else a fresh one (then remembered). The returned tensor is a new
    one on that storage (not a view, not the remembered object), so autograd's AccumulateGrad takes it as ``.grad``
    without a copy."""
    # Under the lock, the check and the new reference are one step: two backwards running at once in two threads
    # (sharing a weight) never both find the same buffer free.
    with _BUFFERS_LOCK:
        storage = _BUFFERS.get(weight)
        if storage is not None and _use_count(storage) == 1 and storage.nbytes() == weight.nbytes:
            return torch.empty(0, dtype=weight.dtype).set_(storage, 0, weight.shape)
        out = torch.empty(weight.shape, dtype=weight.dtype)
        _BUFFERS[weight] = out.untyped_storage()
        return out


def _use_count(storage) -> int:
    """References to ``storage``'s C++ storage (this module's own included); 0 (never reused) without the API."""
    count = getattr(torch._C, "_storage_Use_Count", None)
    return 0 if count is None else count(storage._cdata)


def release_gradient_buffers() -> None:
    """Drops the buffers ``mega_moe``'s eager CPU backward keeps for its experts' weight gradients (a gradient
    still held elsewhere stays valid; the next backward allocates afresh)."""
    with _BUFFERS_LOCK:
        _BUFFERS.clear()


def _takes_weight_grads(args) -> bool:
    """Whether the eager backward forms the routed experts' weight gradients itself (into reused buffers): BF16
    weights of plain CPU tensors, where the k-grouped kernel is this package's C++ one."""
    tensors = [args.x, args.l1_weights, args.l2_weights]
    return (
        all(t.device.type == "cpu" and t.dtype == torch.bfloat16 for t in tensors)
        and (args.l1_weights.requires_grad or args.l2_weights.requires_grad)
        and _plain_call(tensors)
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
        tape = None
        if _takes_weight_grads(args):
            tape = ExpertTape(l1=args.l1_weights.requires_grad, l2=args.l2_weights.requires_grad)
        with _BUFFERS_LOCK:  # a weight no longer trained here (frozen, moved to another device) keeps no buffer
            for name, flag, *_ in _TAPED_GEMMS:
                if tape is None or not getattr(tape, flag):
                    _BUFFERS.pop(getattr(args, name), None)
        # The weights whose gradients the tape takes are recorded without requires_grad: autograd forms neither.
        taken = () if tape is None else [name for name, *_ in _TAPED_GEMMS]
        recorded = [n and name not in taken for name, n in zip(_DIFFERENTIABLE, ctx.needs)]
        leaves = _leaves([getattr(args, name) for name in _DIFFERENTIABLE], recorded)
        with torch.enable_grad():
            y, counts = validated_pipeline(types.SimpleNamespace(**{**vars(args), **leaves}), keep_l1=True, tape=tape)
        ctx.tape = (y, leaves, tape, {"l1_weights": args.l1_weights, "l2_weights": args.l2_weights})
        ctx.mark_non_differentiable(counts)
        return y.detach(), counts

    @staticmethod
    def backward(ctx, grad_y, grad_counts):
        if ctx.tape is None:
            raise RuntimeError(
                "ascend_moe::mega_moe: trying to backward through the graph a second time (its recorded steps were "
                "freed by the first backward); pass retain_graph=True the first time"
            )
        y, leaves, tape, weights = ctx.tape
        keep = _keep_graph()
        if not keep:
            ctx.tape = None  # the tape's buffers go with this backward, as a graph's saved tensors do
        return _grads(y, leaves, ctx.needs, grad_y, retain_graph=keep, tape=tape, weights=weights)


def _eager(*inputs):
    """``_Taped`` for an eager BF16 call (``_registry.autograd``'s ``eager``); None leaves FP8 x FP4 calls, which
    carry no gradient, to torch.library's formula."""
    if arguments(OP, inputs).x.dtype == torch.float8_e4m3fn:
        return None
    return _Taped.apply(*inputs)


autograd(OP, _backward, _setup, eager=_eager)
