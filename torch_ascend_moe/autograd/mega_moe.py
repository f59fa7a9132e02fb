"""Backward of ``mega_moe`` (BF16 mode): the op is the unfused pipeline of our ops, each with its own autograd
formula, so the backward recomputes that pipeline from the saved inputs with autograd on and differentiates it
(straight-through at the BF16 roundings, as those ops' formulas are; the clamp passes gradient inside its
bounds). Nothing of the forward but its inputs is kept. FP8 x FP4 mode: quantized operands carry no gradient
(train in BF16, serve in FP8 x FP4)."""

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


def _backward(ctx, grad_y, grad_counts):
    from torch_ascend_moe.backends.portable.mega_moe import pipeline

    needs = [needs_grad(ctx, OP, name) for name in _DIFFERENTIABLE]
    if ctx.fp8 or grad_y is None or not any(needs):
        return gradients(OP)
    idx, *saved = ctx.saved_tensors
    x, w, l1, l2, shared_l1, shared_l2 = (
        None if t is None else t.detach().requires_grad_(n) for t, n in zip(saved, needs)
    )
    with torch.enable_grad():
        # The same arguments with the saved leaves (scales None: BF16 mode is the differentiable one).
        leaves = dict(zip(_DIFFERENTIABLE, (x, w, l1, l2, shared_l1, shared_l2)))
        y, _ = pipeline(types.SimpleNamespace(**{**ctx.options, **leaves, "topk_idx": idx}))
        wanted = [name for name, n in zip(_DIFFERENTIABLE, needs) if n]
        grads = torch.autograd.grad(y, [leaves[name] for name in wanted], grad_y, allow_unused=True)
    return gradients(
        OP,
        **{
            name: torch.zeros_like(leaves[name]) if g is None else g.to(leaves[name].dtype)
            for name, g in zip(wanted, grads)
        },
    )


autograd(OP, _backward, _setup)
