"""CUDA kernels of the quant family: ``quantize_fp8`` / ``quantize_fp4`` as one launch of the Triton cast
(``_quant``: a program per block, bit for bit the reference casts and the C++ kernel: the same FP32 scale,
reciprocal and rounding, written with integer arithmetic) instead of the portable kernel's padded copy, reductions and
conversion as separate torch ops. Packed UE8M0 scales are packed from the kernel's FP32 ones.

Refused (the portable kernel takes them), and why: blocks larger than 128 x 128 elements (one program holds a
block), FP4 blocks of an odd width (a byte would straddle two blocks), builds without Triton.

``dequantize`` is one launch of ``_quant.dequantize`` (codes decoded in registers, each element times its block's
scale, one rounding) instead of the portable kernel's full-size FP32 copies of the values and of the scales; scales of
any format are widened to FP32 first (``[M/gr, N/gc]``: small).
"""

from __future__ import annotations

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.cuda import triton_available, triton_module
from torch_ascend_moe.checks.quant import QUANTIZE_FP4, QUANTIZE_FP8, dequantize_signature, quantize_signature
from torch_ascend_moe.quant import reference
from torch_ascend_moe.quant.encodings import row_major, scales_to_float

_quant = triton_module("_quant")


def _scales(sf, use_packed_ue8m0: bool):
    return reference.pack_scales(sf) if use_packed_ue8m0 else row_major(sf)


def _takes_fp8(x, block, use_ue8m0, use_packed_ue8m0):
    quantize_signature(QUANTIZE_FP8, x, block, use_ue8m0, use_packed_ue8m0, fp4=False)
    return first_refusal(_quant.refusal(x, block))


def _takes_fp4(x, block, use_ue8m0, use_packed_ue8m0):
    quantize_signature(QUANTIZE_FP4, x, block, use_ue8m0, use_packed_ue8m0, fp4=True)
    width = min(block[1], max(x.shape[1], 1))
    odd = f"FP4 blocks {width} wide: a byte would straddle two blocks" if width % 2 else None
    return first_refusal(odd, _quant.refusal(x, block))


def _takes_dequantize(data, scale, block, out_dtype):
    dequantize_signature(data, scale, block, out_dtype)
    return first_refusal(_quant.dequantize_refusal(data))


@kernel(device="cuda", library="triton", calls="_quant", takes=_takes_fp8, available=triton_available)
def quantize_fp8(x, block, use_ue8m0, use_packed_ue8m0):
    data, sf = _quant.quantize(x, block, use_ue8m0, fp4=False)
    return data, _scales(sf, use_packed_ue8m0)


@kernel(device="cuda", library="triton", calls="_quant", takes=_takes_fp4, available=triton_available)
def quantize_fp4(x, block, use_ue8m0, use_packed_ue8m0):
    data, sf = _quant.quantize(x, block, use_ue8m0, fp4=True)
    return data, _scales(sf, use_packed_ue8m0)


@kernel(device="cuda", library="triton", calls="_quant", takes=_takes_dequantize, available=triton_available)
def dequantize(data, scale, block, out_dtype):
    _, dtype = dequantize_signature(data, scale, block, out_dtype)
    return _quant.dequantize(data, scales_to_float(scale), block, dtype)
