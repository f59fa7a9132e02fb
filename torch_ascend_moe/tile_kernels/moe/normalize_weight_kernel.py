"""Upstream's ``tile_kernels/moe/normalize_weight_kernel.py``, for code importing it: the functions are
``tile_kernels.moe``'s."""

from torch_ascend_moe.tile_kernels.moe import normalize_weight

__all__ = ["normalize_weight"]
