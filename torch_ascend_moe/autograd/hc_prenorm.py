"""Backward of ``hc_prenorm_gemm`` (straight-through for the TF32 rounding of b):
``da = dd @ tf32(b) + 2 a * dsqr`` and ``db = dd^T @ a``, split by split over each split's K range."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad
from torch_ascend_moe.checks.hc_prenorm import split_ranges
from torch_ascend_moe.quant import round_to_tf32


def _setup(ctx, inputs, output):
    args = arguments("hc_prenorm_gemm", inputs)
    ctx.num_splits = args.num_splits
    ctx.save_for_backward(args.a, args.b)


def _backward(ctx, grad_d, grad_sqr):
    a, b = ctx.saved_tensors
    acc = b.dtype
    a_f = a.to(acc)
    b_r = b if acc == torch.float64 else round_to_tf32(b)
    if ctx.num_splits is None:
        ranges, grads = [(0, a.shape[1])], [(grad_d, grad_sqr)]
    else:
        ranges, grads = split_ranges(a.shape[1], ctx.num_splits), list(zip(grad_d, grad_sqr))
    grad_a = torch.zeros_like(a_f) if needs_grad(ctx, "hc_prenorm_gemm", "a") else None
    grad_b = torch.zeros_like(b) if needs_grad(ctx, "hc_prenorm_gemm", "b") else None
    for (k0, k1), (gd, gs) in zip(ranges, grads):
        if k1 == k0:
            continue
        if grad_a is not None:
            grad_a[:, k0:k1] = gd @ b_r[:, k0:k1] + 2 * a_f[:, k0:k1] * gs.unsqueeze(-1)
        if grad_b is not None:
            grad_b[:, k0:k1] = gd.T @ a_f[:, k0:k1]
    return gradients("hc_prenorm_gemm", a=None if grad_a is None else grad_a.to(a.dtype), b=grad_b)


autograd("hc_prenorm_gemm", _backward, _setup)
