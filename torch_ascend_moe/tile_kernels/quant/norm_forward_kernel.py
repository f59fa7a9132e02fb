"""The Ascend-era fork's ``tile_kernels/quant/norm_forward_kernel.py``, for code importing it: the functions are
``tile_kernels.quant``'s."""

from torch_ascend_moe.tile_kernels.quant import norm_forward, norm_forward_and_per_token_cast

__all__ = ["norm_forward", "norm_forward_and_per_token_cast"]
