"""``tile_kernels.modeling.mhc.ops.pre_big_fuse`` (upstream's module name)."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops._functions import mhc_pre_big_fuse

__all__ = ["mhc_pre_big_fuse"]
