"""Upstream's ``tile_kernels/quant/swiglu_backward_and_per_token_cast_kernel.py``,
for code importing it: the function is ``tile_kernels.quant``'s."""

from torch_ascend_moe.tile_kernels.quant import swiglu_backward_and_per_token_cast

__all__ = ["swiglu_backward_and_per_token_cast"]
