"""Device-generic fp8_linear family: the casts (``quantize_fp8``), then ``fp8_gemm``, each step an op call through
the dispatcher, so each reaches the device's own kernel chain (``backends/chain``: DeepGEMM's GEMM, the Triton
cast, torch_npu's, ...). The casts are bit for bit the reference casts on every device."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks.fp8_linear import fp8_linear_signature, fp8_quant_gemm_signature

ops = torch.ops.ascend_moe


@portable_kernel
def fp8_quant_gemm(x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype):
    """``quantize_fp8(x, [1, gran_k])`` then ``fp8_gemm``."""
    _, dtype = fp8_quant_gemm_signature(x, b, sfb, c, gran_k, recipe_b, out_dtype)
    q, sf = ops.quantize_fp8(x, [1, gran_k], use_ue8m0, False)
    return ops.fp8_gemm(q, sf, b, sfb, c, [1, gran_k], recipe_b, alpha, dtype)


@portable_kernel
def fp8_linear(x, weight, bias, block, use_ue8m0, fp8_backward):
    """The forward's two casts, then ``fp8_gemm``. BF16 ``x`` without a bias asks the GEMM for BF16 directly: the
    FP32 sum rounded once, the same bits as FP32 then ``.to(bf16)``, in one kernel."""
    shape = fp8_linear_signature(x, weight, bias, block)
    xq, xs = ops.quantize_fp8(x, [1, block], use_ue8m0, False)
    wq, ws = ops.quantize_fp8(weight, [block, block], use_ue8m0, False)
    if bias is None and x.dtype == torch.bfloat16:
        return ops.fp8_gemm(xq, xs, wq, ws, None, [1, block], [block, block], 1.0, torch.bfloat16)
    c = None if bias is None else bias.float().expand(shape)
    return ops.fp8_gemm(xq, xs, wq, ws, c, [1, block], [block, block], 1.0, torch.float32).to(x.dtype)
