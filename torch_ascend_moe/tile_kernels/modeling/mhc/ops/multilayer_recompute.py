"""``tile_kernels.modeling.mhc.ops.multilayer_recompute`` (upstream's module name)."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops._functions import mhc_multilayer_recompute

__all__ = ["mhc_multilayer_recompute"]
