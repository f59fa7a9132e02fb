"""Device-generic MoE routing with vectorized torch ops (a stable sort by expert; host work is O(E))."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks.moe_routing import (
    PERMUTE,
    UNPERMUTE,
    check_range,
    gating_signature,
    permute_signature,
    unpermute_signature,
)
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.distributed.payload import place_rows
from torch_ascend_moe.routing_math import gate_scores, stable_topk


def check_ids(op: str, arg: str, values: torch.Tensor, high: int, what: str) -> None:
    """``check_range``, skipped while a device graph is captured (its host read would break the capture; the kernels
    clamp every id they gather with)."""
    if not capture.capturing(values.device):
        check_range(op, arg, values, high, what)


@portable_kernel
def moe_permute(x, topk_idx, num_experts, alignment):
    capacity = permute_signature(x, topk_idx, num_experts, alignment)
    check_ids(PERMUTE, "topk_idx", topk_idx, num_experts, "expert ids")
    # Everything below stays on the device (no host read): capturable in a CUDA / NPU graph.
    t, k = topk_idx.shape
    ids = topk_idx.long().flatten()
    key = torch.where(ids >= 0, ids, num_experts)  # unrouted pairs sort last
    order = torch.argsort(key, stable=True)  # by expert, then (t, j): the C++ kernel's order
    counts = torch.zeros(num_experts + 1, dtype=torch.long, device=x.device)
    counts = counts.scatter_add_(0, key, torch.ones_like(key))[:num_experts]
    aligned = (counts + alignment - 1) // alignment * alignment
    starts = torch.cumsum(aligned, 0) - aligned  # each expert's first row: the previous end, aligned up
    first = torch.cumsum(counts, 0) - counts  # each expert's first position among the sorted pairs
    sorted_key = key.index_select(0, order)
    expert = sorted_key.clamp(max=num_experts - 1)
    rank = torch.arange(ids.numel(), device=x.device) - first.index_select(0, expert)
    dest = torch.where(sorted_key < num_experts, starts.index_select(0, expert) + rank, -1)
    row_map = torch.full_like(ids, -1).scatter_(0, order, dest)
    if x.shape[1]:
        out = place_rows(x.index_select(0, torch.div(order, k, rounding_mode="floor")), dest, capacity)
    else:
        out = x.new_zeros(capacity, 0)
    return out, row_map.view(t, k).to(torch.int32), (starts + counts).to(torch.int32)


@portable_kernel
def moe_unpermute(y, row_map, topk_weights, bias=None):
    unpermute_signature(y, row_map, topk_weights, bias)
    check_ids(UNPERMUTE, "row_map", row_map, y.shape[0], "rows of y")
    acc_t = torch.float64 if y.dtype == torch.float64 else torch.float32
    rows = row_map.long()
    if bias is None:
        out = y.new_zeros(rows.shape[0], y.shape[1], dtype=acc_t)
    else:
        out = bias.to(acc_t, copy=True)  # never the caller's tensor: the output must not alias an input
    # Slot by slot from zero (or the bias), as the CPU kernel adds (bitwise the same; a sum over slots may reorder). A
    # -1 slot contributes nothing, whatever the row it was clamped to or its weight holds (NaN included), and leaves a
    # -0.0 bias -0.0: where, not a multiply by 0 or an add of 0.
    for j in range(rows.shape[1]):
        term = y[rows[:, j].clamp(min=0)].to(acc_t)
        if topk_weights is not None:
            term = topk_weights[:, j : j + 1].to(acc_t) * term
        routed = (rows[:, j] >= 0).unsqueeze(-1)
        out = torch.where(routed, out + torch.where(routed, term, 0), out)
    return out.to(y.dtype)


@portable_kernel
def moe_gating_topk(logits, topk, bias, score_func, num_groups, topk_groups, renormalize, routed_scaling_factor):
    acc = gating_signature(logits, topk, bias, score_func, num_groups, topk_groups)
    t, e = logits.shape
    scores = gate_scores(logits.to(acc), score_func)  # softmax or sigmoid in FP32 (FP64)
    choice = scores + bias.to(acc) if bias is not None else scores
    order = torch.sort(choice, dim=-1, descending=True, stable=True).indices
    if 1 < num_groups and topk_groups < num_groups:
        grouped = choice.view(t, num_groups, e // num_groups)
        if bias is not None:  # DeepSeek-V3: the sum of a group's best two
            group_scores = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2].sum(-1)
        else:
            group_scores = grouped.amax(-1)
        kept = stable_topk(group_scores, topk_groups)
        mask = torch.zeros(t, num_groups, dtype=torch.bool, device=logits.device).scatter_(1, kept, True)
        # Kept groups' experts first, then the others, each in choice order (as the C++ kernel).
        in_kept = mask.repeat_interleave(e // num_groups, dim=1).gather(1, order)
        order = order.gather(1, torch.sort(in_kept.to(torch.uint8), dim=-1, descending=True, stable=True).indices)
    idx = order[:, :topk]
    idx = idx.clone(memory_format=torch.contiguous_format)  # contiguous() keeps an empty slice's strides
    weights = scores.gather(1, idx)
    if renormalize:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights.clone(memory_format=torch.contiguous_format), idx
