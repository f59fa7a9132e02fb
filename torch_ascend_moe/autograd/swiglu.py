"""Backward of ``swiglu_forward``: the ``swiglu_backward`` op on the saved input (TileKernels' analytic SwiGLU
gradient with the clamp's zeros and the routing weight's gradient, rows off the psum layout zero). A per-token E4M3
output is not differentiable (codes and scales), nor are the scale and clamp-count outputs."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad, non_differentiable
from torch_ascend_moe.checks import swiglu as checks

OP = "swiglu_forward"
_backward_op = torch.ops.ascend_moe.swiglu_backward.default


def _setup(ctx, inputs, output):
    args = arguments(OP, inputs)
    out, sf, count = output
    ctx.mark_non_differentiable(*((out, sf, count) if checks.forward_out_dtype(args) == checks.FP8 else (sf, count)))
    ctx.options = (args.alignment, args.routed_scaling_factor, args.clamp_value)
    ctx.save_for_backward(args.x, args.topk_weights, args.psum_num_tokens_per_expert)


def _backward(ctx, grad_out, grad_sf, grad_count):
    x, w, psum = ctx.saved_tensors
    if grad_out is None:
        return gradients(OP)
    alignment, scale, clamp = ctx.options
    x_grad, _, _, w_grad, _ = _backward_op(x, None, grad_out, w, psum, alignment, scale, clamp, x.dtype, 0, False)
    return gradients(
        OP,
        x=x_grad if needs_grad(ctx, OP, "x") else None,
        topk_weights=w_grad.to(w.dtype) if w is not None and needs_grad(ctx, OP, "topk_weights") else None,
    )


autograd(OP, _backward, _setup)
non_differentiable("swiglu_backward")
