"""Numerics shared by both flavors: decoding operands and scale factors to float64, the reference GEMM.

Encodings (``shared/specs/deepgemm_api.md`` §2.2, checked against upstream):
* E4M3 (``torch.float8_e4m3fn``) and BF16 convert exactly to float64.
* Packed FP4 (``torch.int8``, upstream ``kPackedFP4``; also DeepGEMM-Ascend ``csrc/utils/dtype.hpp``): two E2M1 codes a
  byte along the tensor's contiguous dimension, element ``2j`` in the low nibble; code bit 3 is the sign, bits 0-2
  index ``{0, .5, 1, 1.5, 2, 3, 4, 6}``.
* UE8M0 code ``e`` means ``2**(e - 127)`` (``e = 255`` is NaN). FP32 -> UE8M0 is ``bits >> 23``: exact only for a
  zero sign and zero mantissa (``(bits & 0x807fffff) == 0``), which is what the SM100 pack kernels
  (``smxx_layout.cuh``) and the Ascend ``transform_sf`` kernel assert on the device.
* Packed int32 (CUDA): scale ``4i + j`` in byte ``j`` of word ``i``; packed int16 (Ascend "ue8m0x2"): scale ``2i + j``
  in byte ``j`` of short ``i``.
"""

from __future__ import annotations

import torch

F64 = torch.float64
E2M1_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=F64)


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def align(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def fp4_values(t: torch.Tensor, packed_dim: int) -> torch.Tensor:
    """Decode an int8 tensor of packed E2M1 pairs; ``packed_dim`` doubles."""
    d = packed_dim % t.dim()
    u = t.view(torch.uint8).to(torch.int64)
    codes = torch.stack([u & 0xF, (u >> 4) & 0xF], dim=d + 1).flatten(d, d + 1)
    mag = E2M1_MAGNITUDES[codes & 7]
    return torch.where((codes & 8) != 0, -mag, mag)


def operand_values(t: torch.Tensor, packed_dim: int | None = None) -> torch.Tensor:
    """float64 values of a data operand (FP8, BF16, FP32, or packed FP4 along ``packed_dim``)."""
    if t.dtype == torch.int8:
        return fp4_values(t, packed_dim)
    return t.to(F64)


def fp32_codes(sf: torch.Tensor):
    """(UE8M0 codes, exact) of an FP32 tensor: ``exact`` is False where the sign or mantissa bits are set."""
    bits = sf.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return (bits >> 23) & 0xFF, (bits & 0x807FFFFF) == 0


def ue8m0_values(codes: torch.Tensor) -> torch.Tensor:
    v = torch.pow(2.0, (codes.to(torch.int64) - 127).to(F64))
    return torch.where(codes == 255, torch.full_like(v, float("nan")), v)


def unpack_bytes(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """Little-endian bytes of an int32 (nbytes=4) or int16 (nbytes=2) tensor, appended along the last dim."""
    v = t.to(torch.int64) & ((1 << (8 * nbytes)) - 1)
    return torch.stack([(v >> (8 * j)) & 0xFF for j in range(nbytes)], dim=-1).flatten(-2, -1)


def pack_bytes(codes: torch.Tensor, nbytes: int) -> torch.Tensor:
    """Inverse of ``unpack_bytes``: ``codes[..., nbytes * P]`` (int64 in 0..255) -> int64 words ``[..., P]``
    holding the two's-complement value of the int32/int16 word."""
    c = codes.reshape(*codes.shape[:-1], -1, nbytes)
    v = torch.zeros(c.shape[:-1], dtype=torch.int64)
    for j in range(nbytes):
        v |= c[..., j] << (8 * j)
    bits = 8 * nbytes
    return torch.where(v >= (1 << (bits - 1)), v - (1 << bits), v)


def pad_last(t: torch.Tensor, size: int, value: int = 0) -> torch.Tensor:
    if t.size(-1) >= size:
        return t
    pad = torch.full((*t.shape[:-1], size - t.size(-1)), value, dtype=t.dtype)
    return torch.cat([t, pad], dim=-1)


def expand_scales(vals: torch.Tensor, mn: int, k: int, gran_mn: int, gran_k: int) -> torch.Tensor:
    """Block scales ``[..., R, C]`` -> per-element ``[..., mn, k]`` (``sf[i // gran_mn, j // gran_k]``)."""
    rows = torch.arange(mn) // gran_mn
    cols = torch.arange(k) // gran_k
    return vals.index_select(-2, rows).index_select(-1, cols)


def mm_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float64 ``a @ b^T`` over the last two dims."""
    return torch.matmul(a.to(F64), b.to(F64).transpose(-1, -2))
