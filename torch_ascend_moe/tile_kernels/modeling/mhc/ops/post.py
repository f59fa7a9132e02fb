"""``tile_kernels.modeling.mhc.ops.post`` (upstream's module name)."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops._functions import mhc_post, mhc_post_bwd, mhc_post_fwd

__all__ = ["mhc_post", "mhc_post_bwd", "mhc_post_fwd"]
