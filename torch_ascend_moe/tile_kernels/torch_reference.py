"""``tile_kernels.torch``: upstream's PyTorch-reference names, bound to the same functions as ``tile_kernels.moe``
(there is one implementation here; our tests judge it against references written from the spec)."""

from __future__ import annotations

from torch_ascend_moe.ops.moe_gate import (
    aux_fi,
    group_count,
    mask_indices_by_tp,
    normalize_weight,
    topk_sum_and_topk_group_idx,
)
from torch_ascend_moe.ops.moe_gate import topk_gate as stable_topk
from torch_ascend_moe.tile_kernels.moe import inplace_unique_group_indices, top2_sum_gate

__all__ = [
    "aux_fi",
    "group_count",
    "inplace_unique_group_indices",
    "mask_indices_by_tp",
    "normalize_weight",
    "stable_topk",
    "top2_sum_gate",
    "topk_sum_and_topk_group_idx",
]
