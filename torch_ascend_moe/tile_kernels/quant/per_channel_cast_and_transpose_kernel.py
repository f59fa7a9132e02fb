"""Upstream's ``tile_kernels/quant/per_channel_cast_and_transpose_kernel.py``, for code importing it: the functions are
``tile_kernels.quant``'s."""

from torch_ascend_moe.tile_kernels.quant import per_channel_cast_and_transpose

__all__ = ["per_channel_cast_and_transpose"]
