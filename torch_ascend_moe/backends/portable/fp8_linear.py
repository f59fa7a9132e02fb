"""Device-generic fp8_linear family: the reference casts (``quant.reference.quantize_fp8``), then the
portable ``fp8_gemm``. Same bits as the C++ kernels' quantization.

``fp8_quant_gemm_steps`` / ``fp8_linear_steps`` are the same computations with each step an op call through
``ops`` (``torch.ops.ascend_moe``: the dispatcher), which a device backend registers as its kernel so each step
reaches that device's own kernel (the cast's, the GEMM's: ``backends/cuda`` and ``backends/npu``)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.backends.portable.fp8_gemm import fp8_gemm
from torch_ascend_moe.meta.fp8_linear import fp8_linear_signature, fp8_quant_gemm_signature
from torch_ascend_moe.quant import reference


@portable_kernel
def fp8_quant_gemm(x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype):
    _, dtype = fp8_quant_gemm_signature(x, b, sfb, c, gran_k, recipe_b, out_dtype)
    q, sf = reference.quantize_fp8(x, (1, gran_k), use_ue8m0, False)
    return fp8_gemm(q, sf, b, sfb, c, [1, gran_k], recipe_b, alpha, dtype)


@portable_kernel
def fp8_linear(x, weight, bias, block, use_ue8m0, fp8_backward):
    shape = fp8_linear_signature(x, weight, bias, block)
    xq, xs = reference.quantize_fp8(x, (1, block), use_ue8m0, False)
    wq, ws = reference.quantize_fp8(weight, (block, block), use_ue8m0, False)
    c = None if bias is None else bias.float().expand(shape)
    return fp8_gemm(xq, xs, wq, ws, c, [1, block], [block, block], 1.0, torch.float32).to(x.dtype)


def fp8_quant_gemm_steps(ops, x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype):
    """``quantize_fp8(x, [1, gran_k])`` then ``fp8_gemm``, through ``ops``."""
    _, dtype = fp8_quant_gemm_signature(x, b, sfb, c, gran_k, recipe_b, out_dtype)
    q, sf = ops.quantize_fp8(x, [1, gran_k], use_ue8m0, False)
    return ops.fp8_gemm(q, sf, b, sfb, c, [1, gran_k], recipe_b, alpha, dtype)


def fp8_linear_steps(ops, x, weight, bias, block, use_ue8m0, fp8_backward):
    """The forward's two casts, then ``fp8_gemm``, through ``ops``. BF16 ``x`` without a bias asks the GEMM for BF16
    directly: the FP32 sum rounded once, the same bits as FP32 then ``.to(bf16)``, in one kernel."""
    shape = fp8_linear_signature(x, weight, bias, block)
    xq, xs = ops.quantize_fp8(x, [1, block], use_ue8m0, False)
    wq, ws = ops.quantize_fp8(weight, [block, block], use_ue8m0, False)
    if bias is None and x.dtype == torch.bfloat16:
        return ops.fp8_gemm(xq, xs, wq, ws, None, [1, block], [block, block], 1.0, torch.bfloat16)
    c = None if bias is None else bias.float().expand(shape)
    return ops.fp8_gemm(xq, xs, wq, ws, c, [1, block], [block, block], 1.0, torch.float32).to(x.dtype)
