"""Upstream's ``tile_kernels/moe/mask_indices_by_tp_kernel.py``, for code importing it: the functions are
``tile_kernels.moe``'s."""

from torch_ascend_moe.tile_kernels.moe import mask_indices_by_tp

__all__ = ["mask_indices_by_tp"]
