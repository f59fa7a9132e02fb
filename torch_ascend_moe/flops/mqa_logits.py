"""FLOP formulas of the mqa_logits family: every (query, head, KV column) score is a D-long dot product
(2·D) plus its ReLU-weighted head sum (2), counted over the whole output (masked columns included)."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula


@register_flop_formula(torch.ops.ascend_moe.mqa_logits)
def mqa_logits_flops(q_shape, q_sf_shape, k_shape, *args, out_shape=None, **kwargs) -> int:
    S, H, _ = q_shape
    return S * H * out_shape[1] * (2 * k_shape[-1] + 2)


@register_flop_formula(torch.ops.ascend_moe.mqa_logits_backward)
def mqa_logits_backward_flops(grad_shape, q_shape, q_sf_shape, k_shape, *args, out_shape=None, **kwargs) -> int:
    # Two score recomputations (one per pass), dq = P k and dk = P^T q.
    S, H, _ = q_shape
    return 4 * 2 * S * H * grad_shape[1] * k_shape[-1]


@register_flop_formula(torch.ops.ascend_moe.paged_mqa_logits)
def paged_mqa_logits_flops(q_shape, q_sf_shape, cache_shape, *args, out_shape=None, **kwargs) -> int:
    B, next_n, H, d = q_shape
    return B * next_n * H * out_shape[1] * (2 * d + 2)


@register_flop_formula(torch.ops.ascend_moe.mqa_topk)
def mqa_topk_flops(*args, out_shape=None, **kwargs) -> int:
    return 0  # comparisons only, no floating-point arithmetic


@register_flop_formula(torch.ops.ascend_moe.paged_mqa_logits_metadata)
def paged_mqa_logits_metadata_flops(*args, out_shape=None, **kwargs) -> int:
    return 0  # integer bookkeeping
