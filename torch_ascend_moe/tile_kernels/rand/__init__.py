"""``tile_kernels.rand`` (the Ascend era's): normal samples where upstream's tests allocate (``config.get_device()``)
and the seed its kernels draw from; off Ascend, as upstream, ``torch.randn`` under ``torch.manual_seed``."""

from __future__ import annotations

from torch_ascend_moe.tile_kernels.rand.randn_kernel import randn, randn_like
from torch_ascend_moe.tile_kernels.rand.seed import set_seed

__all__ = ["randn", "randn_like", "set_seed"]
