"""``tile_kernels.modeling``: the autograd layers (``modeling.mhc``; Engram is not here yet)."""

from torch_ascend_moe.tile_kernels.modeling import mhc

__all__ = ["mhc"]
