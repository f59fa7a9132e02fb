"""``tile_kernels.modeling.mhc.ops.pre_split_mixes`` (upstream's module name)."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops._functions import mhc_pre_split_mixes

__all__ = ["mhc_pre_split_mixes"]
