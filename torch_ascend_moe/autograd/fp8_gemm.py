"""Backward of the fp8_gemm family (``fp8_gemm``, ``fp8_bmm``, ``fp8_einsum``): ``c`` gets ``grad``.

Quantized operands are integer-like codes (FP8/FP4) and carry no gradient; scale gradients are refused
with a clear error. Training reaches the high-precision sources through the quantize-and-GEMM path
(straight-through estimator), not through this op.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients


def _register(name: str) -> None:
    """c gets grad; a and b (codes) get none; a scale that requires grad is refused."""

    def setup(ctx, inputs, output):
        args = arguments(name, inputs)
        ctx.c_dtype = args.c.dtype if args.c is not None and args.c.requires_grad else None
        ctx.scale_needs = {
            arg: isinstance(getattr(args, arg), torch.Tensor) and getattr(args, arg).requires_grad
            for arg in ("sfa", "sfb")
        }

    def backward(ctx, grad):
        for arg, needs in ctx.scale_needs.items():
            if needs:
                raise RuntimeError(
                    f"ascend_moe::{name}: argument '{arg}' requires grad, but scale factors are not "
                    "differentiable here; quantize from a high-precision tensor inside fp8_linear / "
                    "fp8_quant_gemm (straight-through estimator) and train that instead"
                )
        return gradients(name, c=grad.to(ctx.c_dtype) if ctx.c_dtype is not None else None)

    autograd(name, backward, setup)


for _name in ("fp8_gemm", "fp8_bmm", "fp8_einsum"):
    _register(_name)
