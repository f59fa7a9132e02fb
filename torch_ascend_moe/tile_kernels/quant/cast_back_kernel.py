"""Upstream's ``tile_kernels/quant/cast_back_kernel.py``, for code importing it: the functions are
``tile_kernels.quant``'s."""

from torch_ascend_moe.tile_kernels.quant import cast_back, per_token_cast_back

__all__ = ["cast_back", "per_token_cast_back"]
