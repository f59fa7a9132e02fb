"""Upstream DeepEP's V2 test references (``deep_ep/utils/refs.py`` @ dd758ca), ported for gloo ranks: ``dispatch``
(``all_to_all_single`` exchanges; generic SF width and optional ``topk_weights`` as DeepEP-Ascend's variant; FP8 rows
travel as bytes since gloo has no float8 all-to-all), ``generate_pre_combine_data``, ``ordered_accumulate`` and
``combine`` (with ``grouped_reduce``). Independent of the stand-in's code."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


def _a2a(t: torch.Tensor, recv_counts: list, send_counts: list) -> torch.Tensor:
    out = torch.empty((sum(recv_counts), *t.shape[1:]), dtype=t.dtype)
    wire = (lambda v: v.view(torch.uint8)) if t.dtype.itemsize == 1 and t.dtype.is_floating_point else (lambda v: v)
    dist.all_to_all_single(wire(out), wire(t.contiguous()), recv_counts, send_counts)
    return out


def dispatch(x, topk_idx, topk_weights, num_max_tokens_per_rank: int, num_experts: int):
    """refs.py:10-123: rows ordered by (source rank, source token); non-local ``topk_idx`` masked to -1 and local
    ones re-based; weights *not* masked. Returns ``(recv_x, recv_topk_idx, recv_topk_weights, recv_src_token_idx,
    num_recv_tokens_per_rank)``."""
    rank_idx, num_ranks = dist.get_rank(), dist.get_world_size()
    assert num_experts % num_ranks == 0
    num_experts_per_rank = num_experts // num_ranks
    use_fp8 = isinstance(x, tuple)
    x, sf = x if use_fp8 else (x, None)
    num_tokens = x.size(0)
    assert topk_idx.size(0) == num_tokens
    send = {"x": [], "sf": [], "idx": [], "w": [], "src": []}
    num_send = []
    for dst in range(num_ranks):
        lo, hi = dst * num_experts_per_rank, (dst + 1) * num_experts_per_rank
        indices = ((lo <= topk_idx) & (topk_idx < hi)).any(dim=1).nonzero(as_tuple=True)[0]
        num_send.append(indices.numel())
        send["x"].append(x[indices])
        send["sf"].append(sf[indices] if use_fp8 else None)
        idx = topk_idx[indices]
        send["idx"].append(torch.where((lo <= idx) & (idx < hi), idx, torch.full_like(idx, -1)))
        send["w"].append(topk_weights[indices] if topk_weights is not None else None)
        send["src"].append(indices.to(torch.int) + rank_idx * num_max_tokens_per_rank)
    num_recv_t = torch.empty(num_ranks, dtype=torch.int)
    dist.all_to_all_single(num_recv_t, torch.tensor(num_send, dtype=torch.int))
    num_recv = num_recv_t.tolist()
    recv_x = _a2a(torch.cat(send["x"]), num_recv, num_send)
    recv_sf = _a2a(torch.cat(send["sf"]), num_recv, num_send) if use_fp8 else None
    recv_idx = _a2a(torch.cat(send["idx"]), num_recv, num_send)
    recv_w = _a2a(torch.cat(send["w"]), num_recv, num_send) if topk_weights is not None else None
    recv_src = _a2a(torch.cat(send["src"]), num_recv, num_send)
    lo, hi = rank_idx * num_experts_per_rank, (rank_idx + 1) * num_experts_per_rank
    mask = (lo <= recv_idx) & (recv_idx < hi)
    recv_idx = (recv_idx - lo).masked_fill(~mask, -1)
    recv_x = (recv_x, recv_sf) if use_fp8 else recv_x
    return recv_x, recv_idx, recv_w, recv_src, torch.tensor(num_recv, dtype=torch.int)


def generate_pre_combine_data(src_token_global_idx, num_max_tokens_per_rank: int, num_topk: int, hidden: int):
    """refs.py:126-153 (global seed 0): a bf16 ``[N, num_topk, hidden]`` any rank can regenerate."""
    num_ranks = dist.get_world_size()
    token_seeds = src_token_global_idx.to(torch.int64).unsqueeze(1) * num_topk + torch.arange(num_topk).unsqueeze(0)
    max_seed = num_ranks * num_max_tokens_per_rank * num_topk
    result = torch.sin(
        (((token_seeds * 131071 % max_seed).float() + 1) / max_seed).unsqueeze(-1)
        * torch.arange(1, hidden + 1, dtype=torch.float32).broadcast_to(1, 1, hidden)
        + math.sin(0.0)
    )
    return result.to(torch.bfloat16)


def ordered_accumulate(data: torch.Tensor, initial_value: torch.Tensor | None = None) -> torch.Tensor:
    """refs.py:156-174: fp32 accumulation along the top-k dimension in order, one rounding."""
    result = (
        torch.zeros((data.shape[0], data.shape[2]), dtype=torch.float32)
        if initial_value is None
        else initial_value.clone()
    )
    for i in range(data.shape[1]):
        result += data[:, i, :].float()
    return result.to(data.dtype)


def combine(y, topk_idx, num_scaleout_ranks, num_scaleup_ranks, num_experts, bias, reduce_in_local, reduce_in_scaleup):
    """refs.py:177-243: grouped reductions (each group's fp32 sum rounded to bf16 at the group's rightmost slot), then
    ``ordered_accumulate`` from ``bias_0 + bias_1``."""
    num_ranks = num_scaleout_ranks * num_scaleup_ranks
    num_tokens, num_topk, hidden = y.shape
    assert not (not reduce_in_local and reduce_in_scaleup)

    def grouped_reduce(data: torch.Tensor, group_id: torch.Tensor) -> torch.Tensor:
        group_id, src_indices = torch.sort(group_id, dim=-1, stable=True)
        flat = (src_indices + torch.arange(num_tokens).unsqueeze(-1) * num_topk).flatten()
        data = data.view(-1, hidden)[flat].view(num_tokens, num_topk, hidden)
        acc = torch.zeros((num_tokens, hidden), dtype=torch.float32)
        for i in range(num_topk):
            brk = (
                torch.ones(num_tokens, dtype=torch.bool) if i == num_topk - 1 else group_id[:, i] != group_id[:, i + 1]
            )
            acc += data[:, i, :].float()
            rows = torch.where(brk)[0]
            data[rows, i] = acc[rows].to(data.dtype)
            acc[rows] = 0.0
            data[torch.where(~brk)[0], i] = 0.0
        result = torch.empty_like(data)
        result.view(-1, hidden)[flat] = data.view(-1, hidden)
        return result.view(num_tokens, num_topk, hidden)

    per_rank = num_experts // num_ranks
    if reduce_in_local:
        y = grouped_reduce(y, torch.div(topk_idx, per_rank, rounding_mode="floor"))
    if reduce_in_scaleup:
        y = grouped_reduce(y, torch.div(topk_idx, per_rank * num_scaleup_ranks, rounding_mode="floor"))
    if isinstance(bias, tuple):
        bias_sum = bias[0].float() + bias[1].float()
    else:
        bias_sum = bias.float() if bias is not None else None
    return ordered_accumulate(y, bias_sum)
