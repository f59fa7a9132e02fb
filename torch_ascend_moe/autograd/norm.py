"""Backward of ``rms_norm``: the ``rms_norm_backward`` op on the saved sum ``s`` and ``rstd`` (TileKernels'
``norm_backward``), ``residual_out``'s gradient added; ``x`` and ``residual`` get the same gradient (``s = x +
residual``, its rounding taken as the identity); ``rstd`` is not differentiable, nor is ``rms_norm_quant`` (the
inference path)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad, non_differentiable

OP = "rms_norm"
_backward_op = torch.ops.ascend_moe.rms_norm_backward.default


def _setup(ctx, inputs, output):
    args = arguments(OP, inputs)
    out, rstd, residual_out = output
    ctx.mark_non_differentiable(rstd)
    ctx.out_scale = args.out_scale
    ctx.has_residual = args.residual is not None
    ctx.save_for_backward(residual_out if ctx.has_residual else args.x, args.weight, rstd)


def _backward(ctx, grad_out, grad_rstd, grad_residual_out):
    s, weight, rstd = ctx.saved_tensors
    if grad_out is None:
        grad_out = torch.zeros_like(s)
    residual_grad = grad_residual_out if ctx.has_residual else None
    x_grad, w_grad = _backward_op(grad_out.to(s.dtype), s, weight, rstd, residual_grad, ctx.out_scale)
    return gradients(
        OP,
        x=x_grad if needs_grad(ctx, OP, "x") else None,
        residual=x_grad if ctx.has_residual and needs_grad(ctx, OP, "residual") else None,
        weight=w_grad.to(weight.dtype) if weight is not None and needs_grad(ctx, OP, "weight") else None,
    )


autograd(OP, _backward, _setup)
non_differentiable("rms_norm_backward")
non_differentiable("rms_norm_quant")
