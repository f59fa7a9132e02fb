"""Upstream's ``tile_kernels/engram/engram_fused_weight_kernel.py``, for code importing it: the functions are
``tile_kernels.engram``'s."""

from torch_ascend_moe.tile_kernels.engram import fused_weight

__all__ = ["fused_weight"]
