"""``tile_kernels.modeling.mhc.ops.pre_apply_mix`` (upstream's module name)."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops._functions import mhc_pre_apply_mix

__all__ = ["mhc_pre_apply_mix"]
