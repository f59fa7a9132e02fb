"""``tile_kernels.modeling.mhc.ops.norm_fn`` (upstream's module name)."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops._functions import mhc_pre_norm_fn

__all__ = ["mhc_pre_norm_fn"]
