"""Upstream's ``tile_kernels/quant/common.py``, for code importing it: the functions are
``tile_kernels.quant``'s."""

from torch_ascend_moe.tile_kernels.quant import unpack_from_e2m1fn_x2

__all__ = ["unpack_from_e2m1fn_x2"]
