"""Upstream's ``tile_kernels/moe/top2_sum_gate_kernel.py``, for code importing it: the functions are
``tile_kernels.moe``'s."""

from torch_ascend_moe.tile_kernels.moe import top2_sum_gate

__all__ = ["top2_sum_gate"]
