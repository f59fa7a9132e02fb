"""Device-generic quant family: the validation of ``checks/quant.py``, then the plain-torch reference math
(``quant/reference.py``), which the C++ CPU kernel matches bit for bit; ``quantize_blocks`` (TileKernels' cast
rules) has only this kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks.quant import (
    BLOCK_FORMATS,
    QUANTIZE_FP4,
    QUANTIZE_FP8,
    dequantize_signature,
    quantize_blocks_signature,
    quantize_signature,
)
from torch_ascend_moe.quant import reference
from torch_ascend_moe.quant.encodings import encode_e5m6, pack_e2m1, pack_e5m6


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


@portable_kernel
def quantize_blocks(x, fmt, block, round_sf, sf, amax_clamp):
    quantize_blocks_signature(x, fmt, block, round_sf, sf, amax_clamp)
    return tile_cast(x, fmt, block, round_sf, sf, amax_clamp)


def tile_cast(x, fmt, block, round_sf, sf, amax_clamp):
    """TileKernels' cast in torch ops (the op's documented math; checked bit for bit against an independent
    rendering of the spec in tests/quant/specs.py)."""
    max_q, floor = BLOCK_FORMATS[fmt]
    m, n = x.shape
    # A block taller or wider than the matrix is the matrix's own extent (no padding to a huge block).
    gr, gc = min(block[0], max(m, 1)), min(block[1], max(n, 1))
    pad = (0, (-n) % gc, 0, (-m) % gr)
    xf = F.pad(x.float(), pad) if any(pad) else x.float()
    rows, cols = xf.shape[0] // gr, xf.shape[1] // gc
    blocks = xf.view(rows, gr, cols, gc)
    if sf is None:
        if any(pad):
            valid = F.pad(torch.ones_like(x, dtype=torch.bool), pad).view(rows, gr, cols, gc)
            # Padding is excluded from the amax (-1 never wins); a NaN in a block wins (NaN in, NaN scale out).
            amax = torch.where(valid, blocks.abs(), -1.0).amax(dim=(1, 3))
        else:
            amax = blocks.abs().amax(dim=(1, 3))
        amax = torch.clamp(amax, min=floor if amax_clamp is None else amax_clamp)
        limit = torch.full_like(amax, max_q)
        sf = amax / limit
        if round_sf:  # up to a power of two: add the mantissa's all-ones and keep the exponent
            sf = ((sf.view(torch.int32) + 0x007FFFFF) & 0x7F800000).view(torch.float32)
            multiplier = torch.where(sf == 0, 0.0, 1.0 / sf)
        else:
            multiplier = torch.where(sf == 0, 0.0, limit / amax)
    else:
        multiplier = sf.reciprocal()
    q = (blocks * multiplier[:, None, :, None]).reshape(xf.shape)[:m, :n]
    if fmt == "e4m3":  # contiguous as the fake's, whatever x's strides (elementwise ops follow a transposed x)
        return torch.clamp(q, -max_q, max_q).to(torch.float8_e4m3fn).contiguous(), sf.clone()
    if fmt == "e5m6":  # no clamp: TileKernels rounds the scaled value as it is
        return pack_e5m6(encode_e5m6(q)), sf.clone()
    return pack_e2m1(encode_e2m1_rne(q)), sf.clone()


def encode_e2m1_rne(q: torch.Tensor) -> torch.Tensor:
    """E2M1 codes of FP32 values, round to nearest with ties to the even code, saturating at 6 (NaN too, as the
    bit-level conversion does); the sign bit is kept, -0.0 included."""
    a = q.abs()
    # The midpoints between {0, 0.5, 1, 1.5, 2, 3, 4, 6}; a tie goes up where the upper code is even (>=).
    code = (a > 0.25).to(torch.uint8)
    for midpoint, up_on_tie in ((0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True), (5.0, False)):
        code += (a >= midpoint) if up_on_tie else (a > midpoint)
    code = torch.where(q.isnan(), 7, code).to(torch.uint8)
    return code | (torch.signbit(q).to(torch.uint8) << 3)
