"""FLOP formulas of the moe_routing family: permute moves data (0 FLOPs); unpermute is a weighted sum."""

from __future__ import annotations

from torch_ascend_moe._registry import flop_formula


@flop_formula
def moe_permute(*args, out_shape=None, **kwargs) -> int:
    return 0


@flop_formula
def moe_unpermute(y_shape, row_map_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * row_map_shape[0] * row_map_shape[1] * y_shape[1]


@flop_formula
def moe_gating_topk(logits_shape, topk, *args, out_shape=None, **kwargs) -> int:
    # Scores (about 4 per logit: exp, sum, divide, bias) and the weights' renormalization; sorts are not FLOPs.
    return 4 * logits_shape[0] * logits_shape[1] + 3 * logits_shape[0] * topk
