"""The Ascend-era fork's ``tile_kernels/quant/norm_backward_kernel.py``, for code importing it: the functions are
``tile_kernels.quant``'s."""

from torch_ascend_moe.tile_kernels.quant import norm_backward

__all__ = ["norm_backward"]
