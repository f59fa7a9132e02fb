"""``tile_kernels.torch.cast_e5m6``: upstream's reference E5M6 cast and cast-back names over ``tile_kernels.quant``."""

from __future__ import annotations

import torch

from torch_ascend_moe.tile_kernels.quant import _cast
from torch_ascend_moe.tile_kernels.quant import cast_back as _cast_back

__all__ = ["cast_back_from_e5m6", "cast_to_e5m6"]


def cast_to_e5m6(x, num_per_channels: int, use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                 use_packed_ue8m0: bool = False):  # fmt: skip
    """``(packed uint8 [T, 3H / 2], sf)``: the per-token E5M6 cast."""
    assert x.ndim == 2 and x.dtype in (torch.float32, torch.bfloat16)
    assert x.shape[1] % num_per_channels == 0 and x.shape[1] % 8 == 0
    return _cast(x, "e5m6", (1, num_per_channels), None, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def cast_back_from_e5m6(x, fmt: str, x_block_size) -> torch.Tensor:
    return _cast_back(x, fmt, tuple(x_block_size), "e5m6")
