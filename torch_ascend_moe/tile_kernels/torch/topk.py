"""``tile_kernels.torch.topk``: upstream's reference top-k names, with its argument names."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.ops import moe_gate as ops
from torch_ascend_moe.ops.moe_gate import topk_gate as stable_topk  # the best columns, ties to the lower index
from torch_ascend_moe.tile_kernels.moe import moe_topk_gate_backward, moe_topk_gate_forward, top2_sum_gate

__all__ = [
    "moe_topk_gate_backward",
    "moe_topk_gate_forward",
    "sqrt_softplus_ref",
    "stable_topk",
    "top2_sum_gate",
    "topk_sum_and_topk_group_idx",
]


def sqrt_softplus_ref(x: torch.Tensor) -> torch.Tensor:
    """The Ascend era's gate score ``sqrt(softplus(x))``."""
    return F.softplus(x).sqrt()


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_group_sum_topk: int, num_topk_groups: int) -> torch.Tensor:
    """The ``num_topk_groups`` best groups of ``scores [T, G, E/G]`` by the sum of each group's
    ``num_group_sum_topk`` largest scores."""
    return ops.topk_sum_and_topk_group_idx(scores, num_group_sum_topk, num_topk_groups)
