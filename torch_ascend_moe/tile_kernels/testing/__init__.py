"""``tile_kernels.testing``: the helpers upstream's tests use (comparisons, input generators, parameter ids, scale
clean-up)."""

from torch_ascend_moe.tile_kernels.testing import bench, generator, moe, numeric, quant
from torch_ascend_moe.tile_kernels.testing.quant import clear_unused_sf

__all__ = ["bench", "clear_unused_sf", "generator", "moe", "numeric", "quant"]
