"""Upstream's ``tile_kernels/engram/engram_hash_kernel.py``, for code importing it: the functions are
``tile_kernels.engram``'s."""

from torch_ascend_moe.tile_kernels.engram import engram_hash

__all__ = ["engram_hash"]
