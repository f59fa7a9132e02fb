"""Upstream's ``tile_kernels/mhc/multilayer_recompute_kernel.py``, for code importing it: the functions are
``tile_kernels.modeling.mhc.ops``'s."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops import mhc_multilayer_recompute

__all__ = ["mhc_multilayer_recompute"]
