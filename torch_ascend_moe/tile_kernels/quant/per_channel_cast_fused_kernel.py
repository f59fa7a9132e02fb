"""Upstream's ``tile_kernels/quant/per_channel_cast_fused_kernel.py``, for code importing it: the functions are
``tile_kernels.quant``'s."""

from torch_ascend_moe.tile_kernels.quant import per_channel_cast_fused

__all__ = ["per_channel_cast_fused"]
