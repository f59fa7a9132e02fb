"""Upstream's ``tile_kernels/engram/engram_gate_kernel.py``, for code importing it: the functions are
``tile_kernels.engram``'s."""

from torch_ascend_moe.tile_kernels.engram import engram_gate_bwd, engram_gate_fwd

__all__ = ["engram_gate_fwd", "engram_gate_bwd"]
