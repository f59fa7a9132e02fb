"""The Ascend-era fork's ``tile_kernels/moe/moe_topk_gate_forward_kernel.py``, for code importing it: the functions are
``tile_kernels.moe``'s."""

from torch_ascend_moe.tile_kernels.moe import moe_topk_gate, moe_topk_gate_forward

__all__ = ["moe_topk_gate", "moe_topk_gate_forward"]
