"""Backward of ``mega_moe`` (BF16 mode): the op is the unfused pipeline of our ops, each with its own autograd
formula, so the backward recomputes that pipeline from the saved inputs with autograd on and differentiates it
(straight-through at the BF16 roundings, as those ops' formulas are; the clamp passes gradient inside its
bounds). Nothing of the forward but its inputs is kept. FP8 x FP4 mode: quantized operands carry no gradient
(train in BF16, serve in FP8 x FP4)."""

from __future__ import annotations

import torch

_POSITIONS = (0, 3, 4, 6, 8, 10)  # x, topk_weights, l1_weights, l2_weights, shared_l1_weights, shared_l2_weights


def _setup(ctx, inputs, output):
    # torch.library fills in the defaults before calling this: all 15 arguments are here.
    x, _, idx, w, l1, _, l2, _, shared_l1, _, shared_l2, _, group_name, clamp, timeout_s = inputs
    ctx.group_name, ctx.clamp, ctx.timeout_s = group_name, clamp, timeout_s
    ctx.fp8 = x.dtype == torch.float8_e4m3fn
    ctx.save_for_backward(x, idx, w, l1, l2, shared_l1, shared_l2)


def _backward(ctx, grad_y, grad_counts):
    from torch_ascend_moe.backends.portable.mega_moe import pipeline

    # The dispatcher drops trailing arguments equal to their defaults: one gradient per argument it passed.
    given = len(ctx.needs_input_grad)
    nothing = (None,) * given
    needs = [i < given and ctx.needs_input_grad[i] for i in _POSITIONS]
    if ctx.fp8 or grad_y is None or not any(needs):
        return nothing
    x, idx, w, l1, l2, shared_l1, shared_l2 = ctx.saved_tensors
    leaves = [
        None if t is None else t.detach().requires_grad_(n) for t, n in zip((x, w, l1, l2, shared_l1, shared_l2), needs)
    ]
    with torch.enable_grad():
        y, _ = pipeline(
            leaves[0],
            None,
            idx,
            leaves[1],
            leaves[2],
            None,
            leaves[3],
            None,
            leaves[4],
            None,
            leaves[5],
            None,
            ctx.group_name,
            ctx.clamp,
            ctx.timeout_s,
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
