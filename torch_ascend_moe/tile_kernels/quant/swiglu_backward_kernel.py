"""The Ascend-era fork's ``tile_kernels/quant/swiglu_backward_kernel.py``, for code importing it: the functions are
``tile_kernels.quant``'s."""

from torch_ascend_moe.tile_kernels.quant import swiglu_backward, swiglu_backward_and_per_token_cast

__all__ = ["swiglu_backward", "swiglu_backward_and_per_token_cast"]
