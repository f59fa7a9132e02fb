"""``tile_kernels.torch.moe``: upstream's reference names of the routing helpers (the ops, without the kernels'
asserts)."""

from __future__ import annotations

from torch_ascend_moe.ops.moe_gate import aux_fi, group_count, mask_indices_by_tp, normalize_weight
from torch_ascend_moe.tile_kernels.moe import inplace_unique_group_indices

__all__ = ["aux_fi", "group_count", "inplace_unique_group_indices", "mask_indices_by_tp", "normalize_weight"]
