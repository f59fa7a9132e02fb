"""``tile_kernels.torch.cast``: upstream's reference ``cast`` / ``cast_back`` names over ``tile_kernels.quant``'s
casts."""

from __future__ import annotations

import torch

from torch_ascend_moe.tile_kernels.quant import _cast
from torch_ascend_moe.tile_kernels.quant import cast_back as _cast_back

__all__ = ["cast", "cast_back"]


def cast(x, fmt: str, block_size=(32, 32), sf: torch.Tensor | None = None, x_block_size=None, round_sf: bool = False,
         use_tma_aligned_col_major_sf: bool = False, use_packed_ue8m0: bool = False):  # fmt: skip
    """``(data, sf)`` of ``x`` (or a QuantTensor) cast in ``block_size`` blocks; the data alone with a given ``sf``."""
    if sf is not None:
        return _cast(x, fmt, tuple(block_size), x_block_size, False, False, False, sf=sf.float().contiguous())[0]
    return _cast(x, fmt, tuple(block_size), x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def cast_back(x, fmt: str, block_size=(32, 32)) -> torch.Tensor:
    return _cast_back(x, fmt, tuple(block_size))
