"""The quant family's math in plain torch: DeepGEMM's reference quantizers (``deep_gemm.utils.math``), bit for
bit, generalized to ``[rows, cols]`` blocks. It is the portable kernel of ``quantize_fp8`` / ``quantize_fp4`` /
``dequantize`` (every device without a kernel of its own) and what the C++ kernel (``csrc/ops/quant_cpu.cpp``)
is tested against bit for bit. No validation here: the portable kernels validate first (``checks/quant.py``).

Per block: ``amax`` in FP32, floored at 1e-4, over the format maximum (448 for E4M3, 6 for E2M1) is the scale,
optionally rounded up to a power of two (UE8M0); ``x`` is multiplied by the scale's reciprocal and rounded.
Blocks that run past the tensor are zero-padded, which never raises ``amax``. A NaN in a block makes its
scale NaN (UE8M0 code 255), so the whole block dequantizes to NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from torch_ascend_moe.quant.encodings import (
    FP4_MAX,
    FP8_MAX,
    ceil_to_ue8m0,
    decode_e2m1,
    encode_e2m1,
    pack_e2m1,
    pack_ue8m0_to_int,
    row_major,
    scales_to_float,
    unpack_e2m1,
)

AMAX_FLOOR = 1e-4


def _cut(block: Sequence[int], m: int, n: int) -> tuple[int, int]:
    """The block with each side cut to the tensor's: the same blocks and scales, and no padding to a block far
    larger than the tensor."""
    return min(block[0], max(m, 1)), min(block[1], max(n, 1))


def _scaled_blocks(x: torch.Tensor, block: Sequence[int], fmt_max: float, use_ue8m0: bool):
    """(``x`` zero-padded to whole blocks and times its block's reciprocal scale, FP32 ``[R/gr, gr, C/gc, gc]``;
    the scales ``[R/gr, C/gc]``)."""
    (m, n), (gr, gc) = x.shape, _cut(block, *x.shape)
    padded = F.pad(x.float(), (0, (-n) % gc, 0, (-m) % gr))
    blocks = padded.view(padded.shape[0] // gr, gr, padded.shape[1] // gc, gc)
    sf = blocks.abs().amax(dim=(1, 3)).clamp(min=AMAX_FLOOR) / fmt_max
    if use_ue8m0:
        sf = ceil_to_ue8m0(sf)
    return blocks * (1.0 / sf)[:, None, :, None], sf


def pack_scales(sf: torch.Tensor) -> torch.Tensor:
    """UE8M0 scales ``[S, n]`` -> int32 ``[S, ceil(n / 4)]``, a ragged count padded with 1.0 (code 127), as upstream's
    ``per_token_cast_to_fp4`` pads."""
    return pack_ue8m0_to_int(F.pad(sf, (0, (-sf.shape[-1]) % 4), value=1.0))


def quantize_fp8(
    x: torch.Tensor, block: Sequence[int], use_ue8m0: bool, use_packed_ue8m0: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 ``[M, N]``, scales) of ``x [M, N]`` in ``block = [rows, cols]`` blocks."""
    m, n = x.shape
    scaled, sf = _scaled_blocks(x, block, FP8_MAX, use_ue8m0)
    q = scaled.to(torch.float8_e4m3fn).flatten(0, 1).flatten(1)[:m, :n]
    return row_major(q), pack_scales(sf) if use_packed_ue8m0 else row_major(sf)


def quantize_fp4(
    x: torch.Tensor, block: Sequence[int], use_ue8m0: bool, use_packed_ue8m0: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 ``[M, N / 2]`` E2M1 codes, low nibble first; scales) of ``x [M, N]`` (N even)."""
    m, n = x.shape
    scaled, sf = _scaled_blocks(x, block, FP4_MAX, use_ue8m0)
    codes = encode_e2m1(scaled).flatten(0, 1).flatten(1)[:m, :n]
    return row_major(pack_e2m1(codes)), pack_scales(sf) if use_packed_ue8m0 else row_major(sf)


def decoded(data: torch.Tensor) -> torch.Tensor:
    """FP32 values of quantized data: packed FP4 (uint8 ``[..., N / 2]``, two E2M1 codes a byte, low nibble first)
    unpacked to ``[..., N]``, anything else (E4M3) converted as it is."""
    return decode_e2m1(unpack_e2m1(data)) if data.dtype == torch.uint8 else data.float()


def dequantized(data: torch.Tensor, scale: torch.Tensor, block: Sequence[int]) -> torch.Tensor:
    """FP32 ``decoded(data)[..., r, c] * scale[..., r // block[0], c // block[1]]`` over the last two dims (scales FP32,
    E8M0, or int32 / int16 packed UE8M0; scales past the data are ignored): the one block dequantization behind the
    quant family's ``dequantize`` and every portable kernel that reads quantized operands.

    >>> dequantized(torch.full((2, 4), 1.5).to(torch.float8_e4m3fn), torch.tensor([[2.0, 4.0]]), (2, 2)).tolist()
    [[3.0, 3.0, 6.0, 6.0], [3.0, 3.0, 6.0, 6.0]]
    """
    values = decoded(data)
    rows, cols = values.shape[-2:]
    gr, gc = _cut(block, rows, cols)
    full = scales_to_float(scale)
    if gr != 1:
        full = full.repeat_interleave(gr, dim=-2)
    return values * full[..., :rows, :].repeat_interleave(gc, dim=-1)[..., :cols]


def dequantize(
    data: torch.Tensor, scale: torch.Tensor, block: Sequence[int], out_dtype: torch.dtype | None
) -> torch.Tensor:
    """``data [M, N]`` (E4M3) or ``[M, N / 2]`` (packed FP4 uint8) times its block's scale (FP32, E8M0, or int32 /
    int16 packed UE8M0), in FP32, rounded once to ``out_dtype`` (default FP32)."""
    return row_major(dequantized(data, scale, block).to(out_dtype or torch.float32))
