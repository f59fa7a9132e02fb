"""Bit-exact encodings: E2M1 codes and their packing, UE8M0 exponents and their int32/int16 packings.

* E2M1: code ``s e e m``; bit 3 the sign, bits 0-2 index ``E2M1_VALUES``. Rounding follows DeepGEMM's
  reference: the magnitude code counts the midpoints ``|x|`` strictly exceeds, so ties go to the smaller
  magnitude (0.75 -> 0.5, 2.5 -> 2), and a negative value that rounds to zero has no sign bit.
* Packed FP4: byte ``j`` holds element ``2j`` in its low nibble and ``2j + 1`` in its high nibble.
* E5M6 (TileKernels): a 12-bit float, 1 sign, 5 exponent (bias 15), 6 mantissa bits: the top 12 bits of an FP16
  pattern. Encoding follows TileKernels' reference bit for bit: FP32 -> FP16 rounded toward zero, then the 4 low
  FP16 mantissa bits dropped with round-to-nearest-even judged on the FP32 value's 17 low mantissa bits. Eight codes
  pack into three 32-bit words (w0 = c0|c1|c2 high byte, w1 = c2 low nibble|c3|c4|c5 high nibble, w2 = c5 low
  byte|c6|c7, most significant first), stored little-endian: uint8 ``[..., 3n / 2]``.
* UE8M0: an unsigned biased exponent, value ``2^(e - 127)``; 0 means ``2^-127``, 255 is NaN (PyTorch's
  ``float8_e8m0fnu`` has exactly these semantics, so decoding goes through it).
* int32 packing (upstream): scale ``4i + j`` along K is byte ``j`` (bits ``8j..8j+7``) of int32 ``i``.
  int16 packing (DeepGEMM-Ascend "ue8m0x2"): scale ``2i + j`` is byte ``j`` of int16 ``i``.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

FP8_MAX = 448.0  # largest finite float8_e4m3fn
E4M3_AMAX_FLOOR = 1e-4  # TileKernels' default floor of a block's amax before an E4M3 cast (its sf_clamp_min)
FP4_MAX = 6.0  # largest E2M1 magnitude
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_PACKINGS = {torch.int32: 4, torch.int16: 2}


def encode_e2m1(x: torch.Tensor) -> torch.Tensor:
    """E2M1 codes (uint8 in 0..15) of ``x`` (already scaled into [-6, 6]), one per element."""
    magnitude = x.abs().float()
    code = torch.zeros(x.shape, dtype=torch.uint8, device=x.device)
    for midpoint in _E2M1_MIDPOINTS:
        code += (magnitude > midpoint).to(torch.uint8)
    sign = ((x < 0) & (code != 0)).to(torch.uint8) << 3
    return code | sign


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """FP32 values of E2M1 codes (uint8, low 4 bits used)."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=codes.device)
    codes = codes.to(torch.int64)
    magnitude = table[codes & 7]
    return torch.where((codes & 8) != 0, -magnitude, magnitude)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Two codes per byte along the last dim (even length): ``[..., n]`` -> uint8 ``[..., n / 2]``."""
    ck.check_arg(codes.shape[-1] % 2 == 0, "pack_e2m1", "codes", "size(-1)", "an even number", codes.shape[-1])
    codes = codes.to(torch.uint8)
    # Elementwise results follow the input's strides: make the packed bytes row-major whatever came in.
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).contiguous()


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_e2m1``; accepts uint8, int8 (upstream) or ``float4_e2m1fn_x2`` bytes."""
    if packed.dtype != torch.uint8:
        packed = packed.view(torch.uint8)
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


E5M6_MAX = 65024.0  # largest finite E5M6 magnitude


def _fp16_rtz_bits(bits: torch.Tensor) -> torch.Tensor:
    """FP16 bit patterns (int32) of FP32 bit patterns, rounded toward zero (overflow and infinity to infinity)."""
    sign = (bits >> 16) & 0x8000
    exp = (bits >> 23) & 0xFF
    mant = bits & 0x7FFFFF
    normal = (exp >= 113) & (exp <= 142)
    subnormal = (exp >= 103) & (exp <= 112)
    infinite = ((exp > 142) & (exp < 255)) | ((exp == 255) & (mant == 0))
    nan = (exp == 255) & (mant != 0)
    sub_mant = ((0x800000 | mant) >> (113 - exp + 13).clamp(0, 31)) & 0x3FF
    out = torch.where(normal, sign | ((exp - 112) << 10) | (mant >> 13), sign)
    out = torch.where(subnormal, sign | sub_mant, out)
    out = torch.where(infinite, sign | 0x7C00, out)
    return torch.where(nan, sign | 0x7FFF, out)


def encode_e5m6(x: torch.Tensor) -> torch.Tensor:
    """E5M6 codes (int32 in 0..0xFFF) of FP32 ``x`` (see the module docstring's rounding)."""
    bits = row_major(x.float()).view(torch.int32)
    code = _fp16_rtz_bits(bits) >> 4
    # Round to nearest even on the dropped bits: up when they exceed half, or equal it with an odd code.
    up = ((code & 1) + (bits & 0x1FFFF)) > 0x10000
    return (code + up.to(torch.int32)) & 0xFFF


def decode_e5m6(codes: torch.Tensor) -> torch.Tensor:
    """FP32 values of E5M6 codes (each the top 12 bits of an FP16 pattern)."""
    half = ((codes.to(torch.int32) << 4) & 0xFFFF).to(torch.int32)
    return ((half ^ 0x8000) - 0x8000).to(torch.int16).view(torch.float16).float()


def pack_e5m6(codes: torch.Tensor) -> torch.Tensor:
    """Eight 12-bit codes per three little-endian 32-bit words: int ``[..., n]`` -> uint8 ``[..., 3n / 2]``."""
    n = codes.shape[-1]
    ck.check_arg(n % 8 == 0, "pack_e5m6", "codes", "size(-1)", "a multiple of 8", n)
    c = codes.to(torch.int64).reshape(*codes.shape[:-1], n // 8, 8).unbind(-1)
    w0 = (c[0] << 20) | (c[1] << 8) | (c[2] >> 4)
    w1 = ((c[2] & 0xF) << 28) | (c[3] << 16) | (c[4] << 4) | (c[5] >> 8)
    w2 = ((c[5] & 0xFF) << 24) | (c[6] << 12) | c[7]
    words = torch.stack([w0, w1, w2], dim=-1)
    shifts = torch.arange(0, 32, 8, device=codes.device)
    data = (words.unsqueeze(-1) >> shifts) & 0xFF  # little-endian bytes
    return data.to(torch.uint8).reshape(*codes.shape[:-1], n // 8 * 12)


def unpack_e5m6(data: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack_e5m6``: uint8 ``[..., 3n / 2]`` -> int32 codes ``[..., n]``."""
    b = data.to(torch.int64).reshape(*data.shape[:-1], data.shape[-1] // 12, 3, 4)  # not -1: 0 rows have no size
    w0, w1, w2 = (b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24)).unbind(-1)
    c = [w0 >> 20, (w0 >> 8) & 0xFFF, ((w0 & 0xFF) << 4) | (w1 >> 28), (w1 >> 16) & 0xFFF, (w1 >> 4) & 0xFFF,
         ((w1 & 0xF) << 8) | (w2 >> 24), (w2 >> 12) & 0xFFF, w2 & 0xFFF]  # fmt: skip
    return torch.stack(c, dim=-1).flatten(-2).to(torch.int32)


def _float_bits(x: torch.Tensor) -> torch.Tensor:
    return row_major(x.float()).view(torch.int32)


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """The smallest power of two >= |x| (biased exponent clamped to [1, 254]), as FP32; NaN stays NaN
    (UE8M0 code 255), so a group holding NaN dequantizes to NaN instead of a finite 2^127 scale."""
    bits = _float_bits(x)
    exponent = (bits >> 23) & 0xFF
    exponent = exponent + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return torch.where(x.isnan(), x.float(), (exponent.clamp(1, 254) << 23).view(torch.float32))


def _ue8m0_codes(api: str, sf: torch.Tensor) -> torch.Tensor:
    """UE8M0 codes (uint8) of FP32 scales that must be positive powers of two (or +0.0, code 0), or NaN
    (code 255: the scale of a group holding NaN)."""
    bits = _float_bits(sf)
    nan = sf.isnan()
    exact = bool((((bits & ~(0xFF << 23)) == 0) | nan).all())  # no sign bit, no mantissa
    ck.check_arg(exact, api, "sf", "values", "positive powers of two (UE8M0 needs a zero mantissa)", "other values")
    return torch.where(nan, 255, (bits >> 23) & 0xFF).to(torch.uint8)


def row_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` with exactly row-major strides, as dtype views need (``contiguous()`` keeps any stride of a
    size-1 dim, which a view between element sizes rejects)."""
    strides, step = [], 1
    for size in reversed(t.shape):
        strides.append(step)
        step *= max(size, 1)
    if tuple(reversed(strides)) == t.stride():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _pack_codes(api: str, codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    per = _PACKINGS[dtype]
    ck.check_arg(codes.shape[-1] % per == 0, api, "sf", "size(-1)", f"a multiple of {per}", codes.shape[-1])
    if codes.numel() == 0:  # a dtype view of an empty tensor has no strides to check: build it
        return codes.new_empty((*codes.shape[:-1], codes.shape[-1] // per), dtype=dtype)
    return row_major(codes).view(dtype)


def pack_ue8m0_to_int(sf: torch.Tensor) -> torch.Tensor:
    """FP32 powers of two ``[..., 4n]`` -> int32 ``[..., n]`` (upstream's packing)."""
    return _pack_codes("pack_ue8m0_to_int", _ue8m0_codes("pack_ue8m0_to_int", sf), torch.int32)


def pack_ue8m0_to_int16(sf: torch.Tensor) -> torch.Tensor:
    """FP32 powers of two ``[..., 2n]`` -> int16 ``[..., n]`` (DeepGEMM-Ascend's ue8m0x2 packing)."""
    return _pack_codes("pack_ue8m0_to_int16", _ue8m0_codes("pack_ue8m0_to_int16", sf), torch.int16)


def _unpack_codes(api: str, packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    ck.check_arg(packed.dtype == dtype, api, "packed", "dtype", dtype, packed.dtype)
    return row_major(packed).view(torch.uint8)


def _codes_to_float(codes: torch.Tensor) -> torch.Tensor:
    return codes.view(torch.float8_e8m0fnu).float()


def unpack_ue8m0_from_int(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., n]`` -> FP32 ``[..., 4n]``, one scale per byte (code 0 -> 2^-127, 255 -> NaN)."""
    return _codes_to_float(_unpack_codes("unpack_ue8m0_from_int", packed, torch.int32))


def unpack_ue8m0_from_int16(packed: torch.Tensor) -> torch.Tensor:
    """int16 ``[..., n]`` -> FP32 ``[..., 2n]``."""
    return _codes_to_float(_unpack_codes("unpack_ue8m0_from_int16", packed, torch.int16))


def repack_ue8m0(packed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Convert between the int32 (4 per word) and int16 (2 per word) UE8M0 packings, bit-exactly.

    The byte sequence along the last dim is kept; going to int32 pads it with code 0 to a multiple of 4.
    """
    ck.check_arg(
        packed.dtype in _PACKINGS, "repack_ue8m0", "packed", "dtype", "torch.int32 or torch.int16", packed.dtype
    )
    ck.check_arg(dtype in _PACKINGS, "repack_ue8m0", "dtype", "value", "torch.int32 or torch.int16", dtype)
    codes = row_major(packed).view(torch.uint8)
    per = _PACKINGS[dtype]
    tail = (-codes.shape[-1]) % per
    if tail:
        codes = torch.nn.functional.pad(codes, (0, tail))
    return codes.view(dtype)


def scales_to_float(sf: torch.Tensor) -> torch.Tensor:
    """FP32 scales from any supported format: FP32, ``float8_e8m0fnu``, packed int32 or int16 UE8M0.

    Packed formats expand along the last dim (4 or 2 scales per element).
    """
    if sf.dtype == torch.float32:
        return sf
    if sf.dtype == torch.float8_e8m0fnu:
        return sf.float()
    if sf.dtype == torch.int32:
        return unpack_ue8m0_from_int(sf)
    if sf.dtype == torch.int16:
        return unpack_ue8m0_from_int16(sf)
    expected = "torch.float32, torch.float8_e8m0fnu, torch.int32 or torch.int16"
    raise ValueError(ck.message("scales_to_float", "sf", "dtype", expected, sf.dtype))


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """FP32 ``x`` rounded to TF32 (10 mantissa bits, nearest, ties away from zero), as tensor cores read it."""
    rounded = ((_float_bits(x) + 0x1000) & ~0x1FFF).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x)
