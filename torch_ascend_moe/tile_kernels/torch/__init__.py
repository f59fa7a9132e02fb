"""``tile_kernels.torch``: upstream's PyTorch-reference names, bound to the same implementations as the kernels'
names (there is one implementation here; our tests judge it against references written from the spec), in
upstream's submodules (``torch.cast``, ``torch.topk``, ``torch.swiglu``, ...); the Ascend era's references
(``norm_*_ref``, ``rotary_embedding_ref``, ``get_mapping_from_psum``, ``moe_topk_gate_*``) here."""

from __future__ import annotations

# Upstream's layout: one submodule per reference, its names bound here. Relative, and after each submodule's import,
# as upstream's: a copy of this package imported under upstream's name (``sys.modules["tile_kernels"] = ...``) then
# loads its own submodules at init and binds ``cast`` / ``reduce_fused`` / ... to the functions; imported later, a
# submodule would replace the function of its name on the package.
from . import engram, mhc  # noqa: F401
from .cast import cast, cast_back
from .cast_e5m6 import cast_back_from_e5m6, cast_to_e5m6
from .expand_to_fused import expand_to_fused, expand_to_fused_with_sf
from .mhc import *  # noqa: F403  (upstream binds its seven mHC references here)
from .moe import aux_fi, group_count, inplace_unique_group_indices, mask_indices_by_tp, normalize_weight
from .norm import norm_backward_ref, norm_forward_ref
from .per_channel_cast_fused import per_channel_cast_fused
from .reduce_fused import reduce_fused
from .rope import rotary_embedding_ref
from .swiglu import get_mapping_from_psum, swiglu_backward, swiglu_forward
from .topk import (
    moe_topk_gate_backward,
    moe_topk_gate_forward,
    sqrt_softplus_ref,
    stable_topk,
    top2_sum_gate,
    topk_sum_and_topk_group_idx,
)

__all__ = [
    *mhc.__all__,
    "aux_fi",
    "cast",
    "cast_back",
    "cast_back_from_e5m6",
    "cast_to_e5m6",
    "expand_to_fused",
    "expand_to_fused_with_sf",
    "get_mapping_from_psum",
    "group_count",
    "inplace_unique_group_indices",
    "mask_indices_by_tp",
    "moe_topk_gate_backward",
    "moe_topk_gate_forward",
    "norm_backward_ref",
    "norm_forward_ref",
    "normalize_weight",
    "per_channel_cast_fused",
    "reduce_fused",
    "rotary_embedding_ref",
    "sqrt_softplus_ref",
    "stable_topk",
    "swiglu_backward",
    "swiglu_forward",
    "top2_sum_gate",
    "topk_sum_and_topk_group_idx",
]
