"""FLOP formulas of the moe_routing family: permute moves data (0 FLOPs); unpermute is a weighted sum."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula


@register_flop_formula(torch.ops.ascend_moe.moe_permute)
def moe_permute_flops(*args, out_shape=None, **kwargs) -> int:
    return 0


@register_flop_formula(torch.ops.ascend_moe.moe_unpermute)
def moe_unpermute_flops(y_shape, row_map_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * row_map_shape[0] * row_map_shape[1] * y_shape[1]


@register_flop_formula(torch.ops.ascend_moe.moe_gating_topk)
def moe_gating_topk_flops(logits_shape, topk, *args, out_shape=None, **kwargs) -> int:
    # Scores (about 4 per logit: exp, sum, divide, bias) and the weights' renormalization; sorts are not FLOPs.
    return 4 * logits_shape[0] * logits_shape[1] + 3 * logits_shape[0] * topk
