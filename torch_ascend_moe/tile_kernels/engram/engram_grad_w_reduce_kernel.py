"""Upstream's ``tile_kernels/engram/engram_grad_w_reduce_kernel.py``, for code importing it: the functions are
``tile_kernels.engram``'s."""

from torch_ascend_moe.tile_kernels.engram import grad_w_reduce

__all__ = ["grad_w_reduce"]
