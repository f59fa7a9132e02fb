"""Upstream's ``tile_kernels/moe/get_fused_mapping_kernel.py``, for code importing it: the functions are
``tile_kernels.moe``'s."""

from torch_ascend_moe.tile_kernels.moe import get_fused_mapping

__all__ = ["get_fused_mapping"]
