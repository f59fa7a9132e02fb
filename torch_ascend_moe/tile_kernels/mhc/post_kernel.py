"""Upstream's ``tile_kernels/mhc/post_kernel.py``, for code importing it: the functions are
``tile_kernels.modeling.mhc.ops``'s."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops import mhc_post_bwd, mhc_post_fwd

__all__ = ["mhc_post_fwd", "mhc_post_bwd"]
