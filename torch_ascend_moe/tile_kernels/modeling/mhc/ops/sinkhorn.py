"""``tile_kernels.modeling.mhc.ops.sinkhorn`` (upstream's module name)."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops._functions import sinkhorn_normalize

__all__ = ["sinkhorn_normalize"]
