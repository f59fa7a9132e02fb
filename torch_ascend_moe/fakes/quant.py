"""Fakes of the quant family (``quantize_fp8``, ``quantize_fp4``, ``dequantize``, ``quantize_blocks``); the checks
are ``torch_ascend_moe/checks/quant.py``."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.quant import (
    QUANTIZE_FP4,
    QUANTIZE_FP8,
    dequantize_signature,
    quantize_blocks_signature,
    quantize_signature,
)


@fake
def quantize_fp8(x, block, use_ue8m0, use_packed_ue8m0):
    data, scale, scale_dtype = quantize_signature(QUANTIZE_FP8, x, block, use_ue8m0, use_packed_ue8m0, fp4=False)
    return x.new_empty(data, dtype=torch.float8_e4m3fn), x.new_empty(scale, dtype=scale_dtype)


@fake
def quantize_fp4(x, block, use_ue8m0, use_packed_ue8m0):
    data, scale, scale_dtype = quantize_signature(QUANTIZE_FP4, x, block, use_ue8m0, use_packed_ue8m0, fp4=True)
    return x.new_empty(data, dtype=torch.uint8), x.new_empty(scale, dtype=scale_dtype)


@fake
def dequantize(data, scale, block, out_dtype):
    shape, dtype = dequantize_signature(data, scale, block, out_dtype)
    return data.new_empty(shape, dtype=dtype)


@fake
def quantize_blocks(x, fmt, block, round_sf, sf, amax_clamp):
    data, sf_shape = quantize_blocks_signature(x, fmt, block, round_sf, sf, amax_clamp)
    dtype = torch.float8_e4m3fn if fmt == "e4m3" else torch.uint8
    return x.new_empty(data, dtype=dtype), x.new_empty(sf_shape, dtype=torch.float32)
