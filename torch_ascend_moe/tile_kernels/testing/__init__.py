"""``tile_kernels.testing``: the comparison helpers upstream's tests use."""

from torch_ascend_moe.tile_kernels.testing import numeric

__all__ = ["numeric"]
