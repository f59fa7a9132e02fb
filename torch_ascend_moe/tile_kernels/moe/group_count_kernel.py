"""Upstream's ``tile_kernels/moe/group_count_kernel.py``, for code importing it: the functions are
``tile_kernels.moe``'s."""

from torch_ascend_moe.tile_kernels.moe import group_count

__all__ = ["group_count"]
