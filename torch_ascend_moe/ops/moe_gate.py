"""The moe_gate family: DeepSeek's fused MoE gate (TileKernels' ``top2_sum_gate`` / ``moe_topk_gate_forward``)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults
from torch_ascend_moe.routing_math import stable_topk, tp_masked

_gate = torch.ops.ascend_moe.moe_topk_gate.default


@schema_defaults
def moe_topk_gate(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    num_topk: int,
    *,
    num_groups: int = FROM_SCHEMA,
    num_topk_groups: int = FROM_SCHEMA,
    scoring_func: str = FROM_SCHEMA,
    routed_scaling_factor: float = FROM_SCHEMA,
    num_shared_experts: int = FROM_SCHEMA,
    mask: torch.Tensor | None = None,
    fix_routing_mask: torch.Tensor | None = None,
    unmapped_topk_idx: torch.Tensor | None = None,
    to_physical_map: torch.Tensor | None = None,
    logical_count: torch.Tensor | None = None,
    ep_rank: int = FROM_SCHEMA,
    num_ep_ranks: int = FROM_SCHEMA,
    tp_rank: int = FROM_SCHEMA,
    num_tp_ranks: int = FROM_SCHEMA,
    image_bias: torch.Tensor | None = None,
    image_token_mask: torch.Tensor | None = None,
    clamp_denominator: bool = FROM_SCHEMA,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(topk_weights [T, k+S], topk_idx [T, k+S] int64, unmapped_topk_idx [T, k] int64, scores [T, E])``.

    ``logits [T, E]`` FP32 (FP64 for gradcheck). ``u`` = ``scoring_func`` of the logits (``'sigmoid'``,
    ``'sqrtsoftplus'``, ``'softmax'``); experts are ranked by ``u + bias`` (softmax: ``logits + bias``;
    ``image_bias`` on ``image_token_mask`` rows), within the ``num_topk_groups`` best of ``num_groups`` groups (a
    group's score: its top-2 sum), stable top-k (ties to the lower expert); ``fix_routing_mask`` rows take
    ``unmapped_topk_idx``'s experts instead. Weights ``u / max(Σu, 1e-20)`` (``Σu + 1e-20`` with
    ``clamp_denominator=False``, the Ascend-era rule) ``· routed_scaling_factor``; ``num_shared_experts`` slots
    ``E, E+1`` of weight 1 follow; ``to_physical_map`` / ``logical_count`` pick a physical replica per token;
    indices off ``tp_rank`` become -1 and the rest are renumbered per EP rank; rows with ``mask`` False are -1 / 0.
    The third output is the routed experts before mapping (-1 on masked rows), the fourth ``u`` (0 on masked rows).
    Differentiable in ``logits`` (through the weights and the scores).

    >>> w, idx, _, _ = moe_topk_gate(torch.tensor([[0.1, 2.0, -1.0, 0.5]]), None, 2)
    >>> idx.tolist(), round(float(w.sum()), 5)
    ([[1, 3]], 1.0)
    """
    return _gate(
        logits, bias, num_topk, num_groups, num_topk_groups, scoring_func, routed_scaling_factor, num_shared_experts,
        mask, fix_routing_mask, unmapped_topk_idx, to_physical_map, logical_count, ep_rank, num_ep_ranks, tp_rank,
        num_tp_ranks, image_bias, image_token_mask, clamp_denominator,
    )  # fmt: skip


# ---- TileKernels' small routing helpers: compositions of torch ops (device-generic, compile- and export-safe;
# integer-valued or exact, so no autograd of their own). Not ops: each is a handful of ATen calls. ----


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    """``int64 [T, num_topk]``: each row's ``num_topk`` largest columns, descending, ties to the lower column.

    >>> topk_gate(torch.tensor([[1.0, 3.0, 3.0, 0.0]]), 2).tolist()
    [[1, 2]]
    """
    return stable_topk(scores, num_topk).contiguous()


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    """``int64 [T, num_topk_groups]``: the best groups of ``scores [T, G, E/G]`` by the sum of each group's
    ``num_topk_sum`` largest scores, descending, ties to the lower group."""
    return topk_gate(scores.topk(num_topk_sum, dim=-1, sorted=False).values.sum(-1), num_topk_groups)


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(denominator [T], topk_weights / denominator)`` with ``denominator = 1e-20 + w[:, 0] + ... + w[:, k-1]``
    summed in that order (TileKernels' bitwise rule)."""
    denominator = torch.full_like(topk_weights[:, 0], 1e-20)
    for j in range(topk_weights.shape[1]):
        denominator = denominator + topk_weights[:, j]
    return denominator, topk_weights / denominator[:, None]


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    """FP32 ``[E]`` load-balance frequencies ``count(e) · E / (T · num_aux_topk)`` (entries < 0 ignored)."""
    counts = group_count(topk_idx, num_experts)
    T = topk_idx.shape[0]
    if T == 0:
        return counts.float()
    return counts.float() * num_experts / (T * num_aux_topk)


def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """int32 ``[num_groups]``: how often each value in ``[0, num_groups)`` occurs (entries < 0 ignored)."""
    flat = group_idx.reshape(-1).long()
    return torch.zeros(num_groups, dtype=torch.int32, device=group_idx.device).scatter_add_(
        0, flat.clamp(min=0), (flat >= 0).to(torch.int32)
    )


def mask_indices_by_tp(
    indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int, num_tp_ranks: int
) -> torch.Tensor:
    """The experts of TP rank ``tp_rank``'s peers renumbered compactly: index ``(d·num_tp + r)·per + j`` (``per =
    n / num_ep_ranks``) becomes ``d·per + j`` when ``r == tp_rank``; every other index (and negatives) -1."""
    return tp_masked(indices, n // num_ep_ranks, tp_rank, num_tp_ranks)


def unique_group_indices(group_indices: torch.Tensor) -> torch.Tensor:
    """``group_indices`` with every repeat of a value after its first (leftmost) occurrence in a row set to -1."""
    values, order = torch.sort(group_indices, dim=1, stable=True)
    repeat = torch.zeros_like(values, dtype=torch.bool)
    repeat[:, 1:] = values[:, 1:] == values[:, :-1]
    repeat = torch.zeros_like(repeat).scatter_(1, order, repeat)
    return group_indices.masked_fill(repeat, -1)
