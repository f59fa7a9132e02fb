"""Upstream's ``tile_kernels/moe/topk_gate_kernel.py``, for code importing it: ``tile_kernels.moe``'s ``topk_gate``."""

from torch_ascend_moe.tile_kernels.moe import topk_gate

__all__ = ["topk_gate"]
