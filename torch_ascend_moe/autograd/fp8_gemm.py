"""Backward of ``fp8_gemm``: the accumulator ``c`` gets the incoming gradient.

Quantized operands are integer-like codes (FP8/FP4) and carry no gradient; scale gradients are refused
with a clear error. Training reaches the high-precision sources through the quantize-and-GEMM path
(straight-through estimator), not through this op.
"""

from __future__ import annotations

import torch


def _setup_context(ctx, inputs, output):
    a, sfa, b, sfb, c = inputs[:5]
    ctx.c_dtype = None if c is None else c.dtype


def _needs(ctx, i: int) -> bool:
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


def _backward(ctx, grad):
    for i, name in ((1, "sfa"), (3, "sfb")):
        if _needs(ctx, i):
            raise RuntimeError(
                f"ascend_moe::fp8_gemm: argument '{name}' requires grad, but scale factors are not "
                "differentiable here; quantize from a high-precision tensor and train that instead"
            )
    grad_c = grad.to(ctx.c_dtype) if _needs(ctx, 4) else None
    return None, None, None, None, grad_c, None, None, None, None


torch.library.register_autograd("ascend_moe::fp8_gemm", _backward, setup_context=_setup_context)
