"""``tile_kernels.modeling.mhc.ops.head_compute_mix`` (upstream's module name)."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops._functions import mhc_head_compute_mix

__all__ = ["mhc_head_compute_mix"]
