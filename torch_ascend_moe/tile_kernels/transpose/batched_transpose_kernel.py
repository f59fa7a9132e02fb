"""Upstream's ``tile_kernels/transpose/batched_transpose_kernel.py``, for code importing it: the functions are
``tile_kernels.transpose``'s."""

from torch_ascend_moe.tile_kernels.transpose import batched_transpose, transpose

__all__ = ["transpose", "batched_transpose"]
