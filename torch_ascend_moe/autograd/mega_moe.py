"""Backward of ``mega_moe`` (BF16 mode): the op is the unfused pipeline of our ops, each with its own autograd
formula, so the backward recomputes that pipeline from the saved inputs with autograd on and differentiates it
(straight-through at the BF16 roundings, as those ops' formulas are; the clamp passes gradient inside its
bounds). Nothing of the forward but its inputs is kept. FP8 x FP4 mode: quantized operands carry no gradient
(train in BF16, serve in FP8 x FP4)."""

from __future__ import annotations

import torch

_NAMES = ("x", "topk_weights", "l1_weights", "l2_weights")
_POSITIONS = (0, 3, 4, 6)


def _setup(ctx, inputs, output):
    x, x_sf, idx, w, l1, l1_sf, l2, l2_sf = inputs[:8]
    ctx.group_name = inputs[8] if len(inputs) > 8 else None
    ctx.clamp = inputs[9] if len(inputs) > 9 else None
    ctx.timeout_s = inputs[10] if len(inputs) > 10 else 300.0
    ctx.fp8 = x.dtype == torch.float8_e4m3fn
    ctx.save_for_backward(x, idx, w, l1, l2)


def _backward(ctx, grad_y, grad_counts):
    from torch_ascend_moe.backends.portable.mega_moe import pipeline

    nothing = (None,) * 11
    needs = [ctx.needs_input_grad[i] for i in _POSITIONS]
    if ctx.fp8 or grad_y is None or not any(needs):
        return nothing
    x, idx, w, l1, l2 = ctx.saved_tensors
    leaves = [t.detach().requires_grad_(n) for t, n in zip((x, w, l1, l2), needs)]
    with torch.enable_grad():
        y, _ = pipeline(
            leaves[0], None, idx, leaves[1], leaves[2], None, leaves[3], None, ctx.group_name, ctx.clamp, ctx.timeout_s
        )
        wanted = [t for t, n in zip(leaves, needs) if n]
        grads = iter(torch.autograd.grad(y, wanted, grad_y, allow_unused=True))
    out = list(nothing)
    for pos, n, leaf in zip(_POSITIONS, needs, leaves):
        if n:
            g = next(grads)
            out[pos] = torch.zeros_like(leaf) if g is None else g.to(leaf.dtype)
    return tuple(out)


torch.library.register_autograd("ascend_moe::mega_moe", _backward, setup_context=_setup)
