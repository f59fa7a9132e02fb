"""``tile_kernels.modeling.mhc.ops.expand`` (upstream's module name)."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops._functions import expand_to_mhc

__all__ = ["expand_to_mhc"]
