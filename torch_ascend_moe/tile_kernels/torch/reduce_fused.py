"""``tile_kernels.torch.reduce_fused``: upstream's reference ``reduce_fused`` name (``tile_kernels.moe``'s)."""

from __future__ import annotations

from torch_ascend_moe.tile_kernels.moe import reduce_fused
from torch_ascend_moe.tile_kernels.torch.swiglu import elementwise_fma

__all__ = ["elementwise_fma", "reduce_fused"]
