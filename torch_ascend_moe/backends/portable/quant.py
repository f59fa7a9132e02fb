"""Device-generic quant family: the validation of ``meta/quant.py``, then the plain-torch reference math
(``quant/reference.py``), which the C++ CPU kernel matches bit for bit."""

from __future__ import annotations

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.meta.quant import QUANTIZE_FP4, QUANTIZE_FP8, dequantize_signature, quantize_signature
from torch_ascend_moe.quant import reference


@portable_kernel
def quantize_fp8(x, block, use_ue8m0, use_packed_ue8m0):
    quantize_signature(QUANTIZE_FP8, x, block, use_ue8m0, use_packed_ue8m0, fp4=False)
    return reference.quantize_fp8(x, block, use_ue8m0, use_packed_ue8m0)


@portable_kernel
def quantize_fp4(x, block, use_ue8m0, use_packed_ue8m0):
    quantize_signature(QUANTIZE_FP4, x, block, use_ue8m0, use_packed_ue8m0, fp4=True)
    return reference.quantize_fp4(x, block, use_ue8m0, use_packed_ue8m0)


@portable_kernel
def dequantize(data, scale, block, out_dtype):
    dequantize_signature(data, scale, block, out_dtype)
    return reference.dequantize(data, scale, block, out_dtype)
