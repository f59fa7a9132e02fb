"""Upstream's ``tile_kernels/quant/per_block_cast_lossless_kernel.py``, for code importing it: the functions are
``tile_kernels.quant``'s."""

from torch_ascend_moe.tile_kernels.quant import per_block_cast_lossless

__all__ = ["per_block_cast_lossless"]
