"""Backward of the fp8_gemm family (``fp8_gemm``, ``fp8_bmm``, ``fp8_einsum``): ``c`` gets ``grad``.

Quantized operands are integer-like codes (FP8/FP4) and carry no gradient; scale gradients are refused
with a clear error. Training reaches the high-precision sources through the quantize-and-GEMM path
(straight-through estimator), not through this op.
"""

from __future__ import annotations

import torch


def _setup_context(ctx, inputs, output):
    c = inputs[4]
    ctx.c_dtype = None if c is None else c.dtype


def _needs(ctx, i: int) -> bool:
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


def _grads(ctx, grad, op: str, offset: int) -> tuple:
    """Gradients of (a, sfa, b, sfb, c) at positions offset..offset+4 of the op's arguments."""
    for i, name in ((1, "sfa"), (3, "sfb")):
        if _needs(ctx, offset + i):
            raise RuntimeError(
                f"ascend_moe::{op}: argument '{name}' requires grad, but scale factors are not "
                "differentiable here; quantize from a high-precision tensor inside fp8_linear / "
                "fp8_quant_gemm (straight-through estimator) and train that instead"
            )
    grad_c = grad.to(ctx.c_dtype) if _needs(ctx, offset + 4) else None
    return None, None, None, None, grad_c


def _backward(ctx, grad):
    return *_grads(ctx, grad, "fp8_gemm", 0), None, None, None, None


def _bmm_backward(ctx, grad):
    return *_grads(ctx, grad, "fp8_bmm", 0), None, None, None, None


def _einsum_setup_context(ctx, inputs, output):
    _setup_context(ctx, inputs[1:], output)


def _einsum_backward(ctx, grad):
    return None, *_grads(ctx, grad, "fp8_einsum", 1), None, None, None, None


torch.library.register_autograd("ascend_moe::fp8_gemm", _backward, setup_context=_setup_context)
torch.library.register_autograd("ascend_moe::fp8_bmm", _bmm_backward, setup_context=_setup_context)
torch.library.register_autograd("ascend_moe::fp8_einsum", _einsum_backward, setup_context=_einsum_setup_context)
