"""Upstream's ``tile_kernels/torch/expand_to_fused.py``, for code importing it: the functions are
``tile_kernels.moe``'s."""

from torch_ascend_moe.tile_kernels.moe import expand_to_fused, expand_to_fused_with_sf

__all__ = ["expand_to_fused", "expand_to_fused_with_sf"]
