"""Upstream's ``tile_kernels/moe/inplace_unique_group_indices_kernel.py``, for code importing it: the functions are
``tile_kernels.moe``'s."""

from torch_ascend_moe.tile_kernels.moe import inplace_unique_group_indices

__all__ = ["inplace_unique_group_indices"]
