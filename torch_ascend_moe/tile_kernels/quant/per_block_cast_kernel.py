"""Upstream's ``tile_kernels/quant/per_block_cast_kernel.py``, for code importing it: the functions are
``tile_kernels.quant``'s."""

from torch_ascend_moe.tile_kernels.quant import (
    per_block_cast,
    per_block_cast_with_precomputed_sf,
    per_block_cast_with_sf_only,
)

__all__ = ["per_block_cast", "per_block_cast_with_sf_only", "per_block_cast_with_precomputed_sf"]
