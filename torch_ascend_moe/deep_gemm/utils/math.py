"""``deep_gemm.utils.math``: layout arithmetic and the reference quantizers (torch_ascend_moe.quant)."""

from __future__ import annotations

import torch

from torch_ascend_moe.quant import (  # re-exported with upstream's names and signatures
    cast_back_from_fp4,
    cast_back_from_fp8,
    ceil_to_ue8m0,
    pack_ue8m0_to_int,
    per_block_cast_to_fp8,
    per_channel_cast_to_fp8,
    per_custom_dims_cast_to_fp8,
    per_token_cast_to_fp4,
    per_token_cast_to_fp8,
    transpose_packed_fp4,
)
from torch_ascend_moe.quant.encodings import _unpack_codes

# The one list of what upstream star-exports from deep_gemm.utils.math (and deep_gemm itself).
__all__ = [
    "align",
    "cast_back_from_fp4",
    "cast_back_from_fp8",
    "ceil_div",
    "ceil_to_ue8m0",
    "get_tma_aligned_size",
    "pack_ue8m0_to_int",
    "per_block_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp4",
    "per_token_cast_to_fp8",
    "transpose_packed_fp4",
    "unpack_ue8m0_from_int",
]


def ceil_div(x: int, y: int) -> int:
    """``ceil(x / y)`` for non-negative ints. ``ceil_div(7, 4) == 2``."""
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    """``x`` rounded up to a multiple of ``y``. ``align(7, 4) == 8``."""
    return ceil_div(x, y) * y


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """``x`` elements rounded up so the row spans a multiple of 16 bytes (CUDA TMA's rule)."""
    if element_size <= 0 or 16 % element_size:
        raise ValueError(f"get_tma_aligned_size: argument 'element_size': expected a divisor of 16, got {element_size}")
    return align(x, 16 // element_size)


def unpack_ue8m0_from_int(packed_sf: torch.Tensor) -> torch.Tensor:
    """int32 ``[..., n]`` -> FP32 ``[..., 4n]``, upstream's reference: each byte shifted into an FP32 exponent
    field, so code 0 gives 0.0 and 255 gives +inf (``torch_ascend_moe.quant.unpack_ue8m0_from_int`` decodes as the
    hardware's E8M0 does: 2^-127 and NaN)."""
    codes = _unpack_codes("unpack_ue8m0_from_int", packed_sf, torch.int32)
    return (codes.to(torch.int32) << 23).view(torch.float32)
