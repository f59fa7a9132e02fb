"""Backward of the gemm family, written with the family's own ops so compiled backward graphs keep them.

For ``D = alpha * A @ B^T + C``: ``dA = alpha * dD @ B``, ``dB = alpha * dD^T @ A``, ``dC = dD``; alpha is
a constant. The incoming gradient is cast to the operand dtype first, as for a BF16 ``torch.mm`` whose
result was upcast: gradients of BF16 operands are BF16 GEMMs with FP32 accumulation.
"""

from __future__ import annotations

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad
from torch_ascend_moe.ops.gemm import bf16_bmm, bf16_einsum, bf16_gemm


def _setup(name: str):
    def setup(ctx, inputs, output):
        args = arguments(name, inputs)
        ctx.save_for_backward(args.a, args.b)
        ctx.alpha = args.alpha
        ctx.c_dtype = args.c.dtype if args.c is not None and args.c.requires_grad else None
        ctx.equation = getattr(args, "equation", None)

    return setup


def _grad_c(ctx, grad):
    return grad.to(ctx.c_dtype) if ctx.c_dtype is not None else None


def _gemm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    g = grad.to(a.dtype)
    ga = bf16_gemm(g, b.t(), alpha=ctx.alpha, out_dtype=a.dtype) if needs_grad(ctx, "bf16_gemm", "a") else None
    gb = bf16_gemm(g.t(), a.t(), alpha=ctx.alpha, out_dtype=b.dtype) if needs_grad(ctx, "bf16_gemm", "b") else None
    return gradients("bf16_gemm", a=ga, b=gb, c=_grad_c(ctx, grad))


def _bmm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    g = grad.to(a.dtype)
    ga = (
        bf16_bmm(g, b.transpose(1, 2), alpha=ctx.alpha, out_dtype=a.dtype) if needs_grad(ctx, "bf16_bmm", "a") else None
    )
    gb = (
        bf16_bmm(g.transpose(1, 2), a.transpose(1, 2), alpha=ctx.alpha, out_dtype=b.dtype)
        if needs_grad(ctx, "bf16_bmm", "b")
        else None
    )
    return gradients("bf16_bmm", a=ga, b=gb, c=_grad_c(ctx, grad))


# The per-head equations are closed under differentiation: each gradient is another supported
# equation, given as (equation, first operand, second operand) of (grad, a, b).
_EINSUM_GRADS = {
    "bhr,hdr->bhd": (lambda g, a, b: ("bhd,hdr->bhr", g, b), lambda g, a, b: ("bhd,bhr->hdr", g, a)),
    "bhd,hdr->bhr": (lambda g, a, b: ("bhr,hdr->bhd", g, b), lambda g, a, b: ("bhd,bhr->hdr", a, g)),
    "bhd,bhr->hdr": (lambda g, a, b: ("bhr,hdr->bhd", b, g), lambda g, a, b: ("bhd,hdr->bhr", a, g)),
}


def _einsum_backward(ctx, grad):
    a, b = ctx.saved_tensors
    g = grad.to(a.dtype)
    ga = gb = None
    if ctx.equation == "bmk,bnk->mn":
        # D = sum_s A[s] @ B[s]^T, so dA[s] = dD @ B[s] and dB[s] = dD^T @ A[s].
        slices = a.shape[0]
        if needs_grad(ctx, "bf16_einsum", "a"):
            ga = bf16_bmm(g.expand(slices, *g.shape), b.transpose(1, 2), alpha=ctx.alpha, out_dtype=a.dtype)
        if needs_grad(ctx, "bf16_einsum", "b"):
            gt = g.t()
            gb = bf16_bmm(gt.expand(slices, *gt.shape), a.transpose(1, 2), alpha=ctx.alpha, out_dtype=b.dtype)
    else:
        grad_a, grad_b = _EINSUM_GRADS[ctx.equation]
        if needs_grad(ctx, "bf16_einsum", "a"):
            ga = bf16_einsum(*grad_a(g, a, b), alpha=ctx.alpha, out_dtype=a.dtype)
        if needs_grad(ctx, "bf16_einsum", "b"):
            gb = bf16_einsum(*grad_b(g, a, b), alpha=ctx.alpha, out_dtype=b.dtype)
    return gradients("bf16_einsum", a=ga, b=gb, c=_grad_c(ctx, grad))


autograd("bf16_gemm", _gemm_backward, _setup("bf16_gemm"))
autograd("bf16_bmm", _bmm_backward, _setup("bf16_bmm"))
autograd("bf16_einsum", _einsum_backward, _setup("bf16_einsum"))
