"""``tile_kernels.modeling``: the autograd layers (``modeling.mhc``, ``modeling.engram``)."""

from torch_ascend_moe.tile_kernels.modeling import engram, mhc

__all__ = ["engram", "mhc"]
