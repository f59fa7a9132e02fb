"""``tile_kernels.modeling.mhc.ops``: upstream's mHC autograd layers (``_functions``), one module per upstream
module name."""

from torch_ascend_moe.tile_kernels.modeling.mhc.ops._functions import (
    expand_to_mhc,
    mhc_head_compute_mix,
    mhc_multilayer_recompute,
    mhc_post,
    mhc_post_bwd,
    mhc_post_fwd,
    mhc_pre_apply_mix,
    mhc_pre_big_fuse,
    mhc_pre_norm_fn,
    mhc_pre_split_mixes,
    sinkhorn_normalize,
)

__all__ = [
    "expand_to_mhc",
    "mhc_head_compute_mix",
    "mhc_multilayer_recompute",
    "mhc_post",
    "mhc_post_bwd",
    "mhc_post_fwd",
    "mhc_pre_apply_mix",
    "mhc_pre_big_fuse",
    "mhc_pre_norm_fn",
    "mhc_pre_split_mixes",
    "sinkhorn_normalize",
]
