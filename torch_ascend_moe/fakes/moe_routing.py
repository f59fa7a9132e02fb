"""Fakes of the moe_routing family; the checks are ``torch_ascend_moe/checks/moe_routing.py``."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.moe_routing import gating_signature, permute_signature, unpermute_signature


@fake
def moe_permute(x, topk_idx, num_experts, alignment):
    capacity = permute_signature(x, topk_idx, num_experts, alignment)
    return (
        x.new_empty([capacity, x.shape[1]]),
        topk_idx.new_empty(topk_idx.shape, dtype=torch.int32),
        topk_idx.new_empty([num_experts], dtype=torch.int32),
    )


@fake
def moe_unpermute(y, row_map, topk_weights, bias):
    unpermute_signature(y, row_map, topk_weights, bias)
    return y.new_empty([row_map.shape[0], y.shape[1]])


@fake
def moe_gating_topk(logits, topk, bias, score_func, num_groups, topk_groups, renormalize, routed_scaling_factor):
    acc = gating_signature(logits, topk, bias, score_func, num_groups, topk_groups)
    t = logits.shape[0]
    return logits.new_empty([t, topk], dtype=acc), logits.new_empty([t, topk], dtype=torch.int64)
