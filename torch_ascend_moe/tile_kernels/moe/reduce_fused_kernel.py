"""Upstream's ``tile_kernels/moe/reduce_fused_kernel.py``, for code importing it: the functions are
``tile_kernels.moe``'s."""

from torch_ascend_moe.tile_kernels.moe import reduce_fused

__all__ = ["reduce_fused"]
