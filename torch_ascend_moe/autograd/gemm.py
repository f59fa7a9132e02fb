"""Backward of the gemm family, written with the family's own ops so compiled backward graphs keep them.

For ``D = alpha * A @ B^T + C``: ``dA = alpha * dD @ B``, ``dB = alpha * dD^T @ A``, ``dC = dD``; alpha is
a constant. The incoming gradient is cast to the operand dtype first, as for a BF16 ``torch.mm`` whose
result was upcast: gradients of BF16 operands are BF16 GEMMs with FP32 accumulation.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.ops.gemm import bf16_bmm, bf16_einsum, bf16_gemm


def _needs(ctx, i: int) -> bool:
    # The dispatcher drops trailing arguments equal to their defaults, so needs_input_grad may be short.
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


def _setup_context(ctx, inputs, output):
    # inputs arrive with defaults filled: ([equation,] a, b, c, alpha, out_dtype).
    a, b, c, alpha, _ = inputs[-5:]
    ctx.save_for_backward(a, b)
    ctx.alpha = alpha
    ctx.c_index = len(inputs) - 3
    ctx.c_dtype = None if c is None else c.dtype


def _grad_c(ctx, grad):
    return grad.to(ctx.c_dtype) if _needs(ctx, ctx.c_index) else None


def _gemm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    g = grad.to(a.dtype)
    ga = bf16_gemm(g, b.t(), alpha=ctx.alpha, out_dtype=a.dtype) if _needs(ctx, 0) else None
    gb = bf16_gemm(g.t(), a.t(), alpha=ctx.alpha, out_dtype=b.dtype) if _needs(ctx, 1) else None
    return ga, gb, _grad_c(ctx, grad), None, None


def _bmm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    g = grad.to(a.dtype)
    ga = bf16_bmm(g, b.transpose(1, 2), alpha=ctx.alpha, out_dtype=a.dtype) if _needs(ctx, 0) else None
    gb = bf16_bmm(g.transpose(1, 2), a.transpose(1, 2), alpha=ctx.alpha, out_dtype=b.dtype) if _needs(ctx, 1) else None
    return ga, gb, _grad_c(ctx, grad), None, None


# The per-head equations are closed under differentiation: each gradient is another supported
# equation, given as (equation, first operand, second operand) of (grad, a, b).
_EINSUM_GRADS = {
    "bhr,hdr->bhd": (lambda g, a, b: ("bhd,hdr->bhr", g, b), lambda g, a, b: ("bhd,bhr->hdr", g, a)),
    "bhd,hdr->bhr": (lambda g, a, b: ("bhr,hdr->bhd", g, b), lambda g, a, b: ("bhd,bhr->hdr", a, g)),
    "bhd,bhr->hdr": (lambda g, a, b: ("bhr,hdr->bhd", b, g), lambda g, a, b: ("bhd,hdr->bhr", a, g)),
}


def _einsum_setup_context(ctx, inputs, output):
    _setup_context(ctx, inputs, output)
    ctx.equation = inputs[0]


def _einsum_backward(ctx, grad):
    a, b = ctx.saved_tensors
    g = grad.to(a.dtype)
    ga = gb = None
    if ctx.equation == "bmk,bnk->mn":
        # D = sum_s A[s] @ B[s]^T, so dA[s] = dD @ B[s] and dB[s] = dD^T @ A[s].
        slices = a.shape[0]
        if _needs(ctx, 1):
            ga = bf16_bmm(g.expand(slices, *g.shape), b.transpose(1, 2), alpha=ctx.alpha, out_dtype=a.dtype)
        if _needs(ctx, 2):
            gt = g.t()
            gb = bf16_bmm(gt.expand(slices, *gt.shape), a.transpose(1, 2), alpha=ctx.alpha, out_dtype=b.dtype)
    else:
        grad_a, grad_b = _EINSUM_GRADS[ctx.equation]
        if _needs(ctx, 1):
            ga = bf16_einsum(*grad_a(g, a, b), alpha=ctx.alpha, out_dtype=a.dtype)
        if _needs(ctx, 2):
            gb = bf16_einsum(*grad_b(g, a, b), alpha=ctx.alpha, out_dtype=b.dtype)
    return None, ga, gb, _grad_c(ctx, grad), None, None


torch.library.register_autograd("ascend_moe::bf16_gemm", _gemm_backward, setup_context=_setup_context)
torch.library.register_autograd("ascend_moe::bf16_bmm", _bmm_backward, setup_context=_setup_context)
torch.library.register_autograd("ascend_moe::bf16_einsum", _einsum_backward, setup_context=_einsum_setup_context)
