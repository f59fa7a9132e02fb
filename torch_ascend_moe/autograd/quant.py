"""Backward of the quant family: codes carry no gradient; ``dequantize``'s FP32 scale does.

The quantize ops' outputs are marked non-differentiable. A straight-through gradient through the codes (``dx =
d data / scale``) would be exact as a formula but not as storage: autograd keeps a tensor's gradient in the tensor's
dtype, so ``d data`` of E4M3 data is itself E4M3 (3 mantissa bits, nothing below 2^-9: a gradient of 1e-3 times a
scale of 2e-3 is 0) and FP4 codes are integers. Silent zeros are worse than no gradient, so training goes through
``quant.fake_quantize`` (the straight-through estimator in high precision, on these ops) or the ops that cast
inside (``fp8_linear``, ``fp8_quant_gemm``), as the fp8_gemm family's operands carry none either.

``dequantize``: ``out = data * scale`` per block, so ``d scale[i, j] = sum over block (i, j) of grad * data``,
exact for an FP32 scale (a learned scale); E8M0 scales are exponent codes and are refused with a clear error;
``data`` gets none.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad
from torch_ascend_moe.ops.quant import dequantize

QUANTIZE = ("quantize_fp8", "quantize_fp4", "quantize_blocks")
DEQUANTIZE = "dequantize"


def _quantize_setup_context(ctx, inputs, output):
    ctx.mark_non_differentiable(*output)


def _register_quantize(name: str) -> None:
    # The outputs are non-differentiable, so autograd never asks for a gradient: every input gets none.
    autograd(name, lambda ctx, grad_data, grad_scale: gradients(name), _quantize_setup_context)


def _block_sums(t: torch.Tensor, block) -> torch.Tensor:
    """Sums of ``t [M, N]`` over ``block`` blocks (zero-padded at the edges): ``[ceil(M/rows), ceil(N/cols)]``."""
    (m, n), (gr, gc) = t.shape, block
    gr, gc = min(gr, max(m, 1)), min(gc, max(n, 1))  # the same blocks, without padding to a huge block
    padded = F.pad(t, (0, (-n) % gc, 0, (-m) % gr))
    return padded.view(padded.shape[0] // gr, gr, padded.shape[1] // gc, gc).sum(dim=(1, 3))


def _dequantize_setup_context(ctx, inputs, output):
    args = arguments(DEQUANTIZE, inputs)
    ctx.block, ctx.scale_dtype = list(args.block), args.scale.dtype
    ctx.save_for_backward(args.data, args.scale)


def _dequantize_backward(ctx, grad):
    grad_scale = None
    if needs_grad(ctx, DEQUANTIZE, "scale"):
        if ctx.scale_dtype != torch.float32:
            raise RuntimeError(
                f"ascend_moe::dequantize: argument 'scale' requires grad, but only FP32 scales are differentiable "
                f"(got {ctx.scale_dtype}: UE8M0 scales are exponent codes)"
            )
        data, scale = ctx.saved_tensors
        values = dequantize(data, torch.ones_like(scale), ctx.block)  # the data's values (exact in FP32)
        # Summed in FP32, or in the gradient's FP64.
        grad_scale = _block_sums(grad * values.to(torch.promote_types(grad.dtype, torch.float32)), ctx.block)
    return gradients(DEQUANTIZE, scale=grad_scale)


for _name in QUANTIZE:
    _register_quantize(_name)
autograd(DEQUANTIZE, _dequantize_backward, _dequantize_setup_context)
