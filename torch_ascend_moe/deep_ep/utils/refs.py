"""``deep_ep.utils.refs``: the reference dispatch / combine of DeepEP V2's ``tests/elastic/test_ep.py``
(specs/deepep_api.md §8.4), upstream's names, signatures and semantics.

Upstream (``deep_ep/utils/refs.py``) runs over ``torch.distributed``'s default group with ``all_to_all_single``;
ours does the same, on whatever device the inputs live on (CPU with gloo included). Differences, all from the
DeepEP-Ascend variant or needed off CUDA:

* ``topk_weights`` may be ``None`` in ``dispatch`` (nothing is exchanged for it, ``recv_topk_weights`` is ``None``);
* the FP8 scale-factor tensor may have any width ``[T, S]`` (upstream asserts ``S == ceil(hidden / 128)``);
* 1-byte float payloads (FP8) travel as ``uint8`` views: gloo has no FP8 type, and bytes are bitwise the same.

Results are bitwise upstream's: same selection order, same FP32 accumulation order, same BF16 roundings.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from torch_ascend_moe.deep_ep.utils.envs import get_global_seed

_PRIME = 131071  # upstream's hashing prime for generate_pre_combine_data


def _exchange(recv: torch.Tensor, send: torch.Tensor, recv_splits: list[int], send_splits: list[int]) -> None:
    """Variable-split ``all_to_all_single`` along dim 0; FP8 goes as bytes (same element size, so the splits hold)."""
    if send.dtype.is_floating_point and send.element_size() == 1:
        recv, send = recv.view(torch.uint8), send.view(torch.uint8)
    dist.all_to_all_single(recv, send, recv_splits, send_splits)


def dispatch(
    x: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor | None,
    num_max_tokens_per_rank: int,
    num_experts: int,
):
    """Reference dispatch of tokens to the ranks owning their experts, over the default process group.

    Not expanded: a token goes once to each rank that owns any of its experts, rows ordered by source rank then
    source token, i.e. by ``src_token_global_idx = src_rank * num_max_tokens_per_rank + src_token``.

    Arguments: ``x`` ``[T, hidden]`` or ``([T, hidden], [T, S])`` (FP8 data, scale factors); ``topk_idx``
    ``[T, K]`` (``-1`` = no expert); ``topk_weights`` ``[T, K]`` or ``None``; ``num_max_tokens_per_rank`` >= every
    rank's ``T``; ``num_experts`` divisible by the world size.

    Returns ``(recv_x, recv_topk_idx, recv_topk_weights, recv_src_token_idx, num_recv_tokens_per_rank)``:
    ``recv_x`` as ``x`` (a tuple for FP8); ``recv_topk_idx`` local expert ids, ``-1`` where the expert is not on
    this rank; ``recv_topk_weights`` unmasked (``None`` if not given); ``recv_src_token_idx`` int32 global ids;
    ``num_recv_tokens_per_rank`` int32 ``[num_ranks]`` (on torch's default device, as upstream's ``torch.tensor``).
    """
    rank_idx = dist.get_rank()
    num_ranks = dist.get_world_size()
    if num_experts % num_ranks != 0:
        raise ValueError(
            f"deep_ep.utils.refs.dispatch: num_experts ({num_experts}) must be divisible by the world size "
            f"({num_ranks})"
        )
    num_experts_per_rank = num_experts // num_ranks

    use_fp8 = isinstance(x, tuple)
    x, sf = x if use_fp8 else (x, None)
    device = x.device

    num_tokens, hidden = x.size()
    if topk_idx.dim() != 2 or topk_idx.size(0) != num_tokens:
        raise ValueError(
            f"deep_ep.utils.refs.dispatch: topk_idx must be [{num_tokens}, num_topk], got {list(topk_idx.shape)}"
        )
    num_topk = topk_idx.size(1)
    if sf is not None and (sf.dim() != 2 or sf.size(0) != num_tokens):
        # Any scale width: the DeepEP-Ascend variant does not tie it to a 128-channel recipe.
        raise ValueError(f"deep_ep.utils.refs.dispatch: sf must be [{num_tokens}, S], got {list(sf.shape)}")
    if topk_weights is not None and tuple(topk_weights.shape) != (num_tokens, num_topk):
        raise ValueError(
            f"deep_ep.utils.refs.dispatch: topk_weights must be [{num_tokens}, {num_topk}], "
            f"got {list(topk_weights.shape)}"
        )

    # Per destination rank: tokens with any expert there, in ascending token order, idx masked to that rank.
    send_x, send_sf, send_idx, send_weights, send_src = [], [], [], [], []
    num_send_tokens_per_rank = torch.zeros((num_ranks,), dtype=torch.int, device=device)
    for dst_rank_idx in range(num_ranks):
        start, end = dst_rank_idx * num_experts_per_rank, (dst_rank_idx + 1) * num_experts_per_rank
        in_range = (start <= topk_idx) & (topk_idx < end)
        indices = in_range.any(dim=1).nonzero(as_tuple=True)[0]
        num_send_tokens_per_rank[dst_rank_idx] = indices.numel()
        send_x.append(x[indices])
        if use_fp8:
            send_sf.append(sf[indices])
        send_idx.append(torch.where(in_range[indices], topk_idx[indices], torch.full_like(topk_idx[indices], -1)))
        if topk_weights is not None:
            send_weights.append(topk_weights[indices])
        send_src.append(indices)

    send_x = torch.cat(send_x, dim=0)
    send_sf = torch.cat(send_sf, dim=0) if use_fp8 else None
    send_idx = torch.cat(send_idx, dim=0)
    send_weights = torch.cat(send_weights, dim=0) if topk_weights is not None else None
    send_src = torch.cat(send_src, dim=0).to(torch.int) + rank_idx * num_max_tokens_per_rank

    # Counts first, then every payload with the same variable splits.
    num_recv_tokens_per_rank = torch.empty((num_ranks,), dtype=torch.int, device=device)
    dist.all_to_all_single(num_recv_tokens_per_rank, num_send_tokens_per_rank)
    send_splits = num_send_tokens_per_rank.tolist()
    recv_splits = num_recv_tokens_per_rank.tolist()
    num_recv_tokens = sum(recv_splits)

    recv_x = torch.empty((num_recv_tokens, hidden), dtype=x.dtype, device=device)
    _exchange(recv_x, send_x, recv_splits, send_splits)
    recv_sf = None
    if use_fp8:
        recv_sf = torch.empty((num_recv_tokens, sf.size(1)), dtype=sf.dtype, device=device)
        _exchange(recv_sf, send_sf, recv_splits, send_splits)
    recv_topk_idx = torch.empty((num_recv_tokens, num_topk), dtype=topk_idx.dtype, device=device)
    _exchange(recv_topk_idx, send_idx, recv_splits, send_splits)
    recv_topk_weights = None
    if topk_weights is not None:
        recv_topk_weights = torch.empty((num_recv_tokens, num_topk), dtype=topk_weights.dtype, device=device)
        _exchange(recv_topk_weights, send_weights, recv_splits, send_splits)
    recv_src_token_idx = torch.empty((num_recv_tokens,), dtype=torch.int, device=device)
    _exchange(recv_src_token_idx, send_src, recv_splits, send_splits)

    # Re-base to local expert ids; experts of other ranks (already -1 from the sender) stay -1.
    start = rank_idx * num_experts_per_rank
    mask = (start <= recv_topk_idx) & (recv_topk_idx < start + num_experts_per_rank)
    recv_topk_idx = recv_topk_idx - start
    recv_topk_idx.masked_fill_(~mask, -1)

    recv_x = (recv_x, recv_sf) if use_fp8 else recv_x
    return (
        recv_x,
        recv_topk_idx,
        recv_topk_weights,
        recv_src_token_idx,
        torch.tensor(recv_splits, dtype=torch.int),
    )


def generate_pre_combine_data(
    src_token_global_idx: torch.Tensor, num_max_tokens_per_rank: int, num_topk: int, hidden: int
) -> torch.Tensor:
    """Deterministic BF16 expert outputs ``[N, num_topk, hidden]`` for the tokens ``src_token_global_idx`` ``[N]``:

    ``y[i, j, k] = sin(((s * 131071 % max_seed) + 1) / max_seed * (k + 1) + sin(global_seed))`` with
    ``s = src_token_global_idx[i] * num_topk + j`` and ``max_seed = world_size * num_max_tokens_per_rank * num_topk``,
    so any rank can regenerate any token's values (``envs.get_global_seed()``; world size of the default group).
    """
    num_ranks = dist.get_world_size()
    device = src_token_global_idx.device
    token_seeds = src_token_global_idx.unsqueeze(1) * num_topk + torch.arange(num_topk, device=device).unsqueeze(0)
    max_seed = num_ranks * num_max_tokens_per_rank * num_topk
    phase = ((token_seeds * _PRIME % max_seed).float() + 1) / max_seed
    channels = torch.arange(1, hidden + 1, device=device, dtype=torch.float32).broadcast_to(1, 1, hidden)
    result = torch.sin(phase.unsqueeze(-1) * channels + math.sin(float(get_global_seed())))
    return result.to(torch.bfloat16)


def ordered_accumulate(data: torch.Tensor, initial_value: torch.Tensor | None = None) -> torch.Tensor:
    """Sum ``data`` ``[N, K, hidden]`` over K in slot order, starting from ``initial_value`` ``[N, hidden]``
    (FP32 zeros if ``None``; cloned, accumulated in its dtype), then cast to ``data``'s dtype once."""
    if initial_value is None:
        result = torch.zeros((data.shape[0], data.shape[2]), dtype=torch.float32, device=data.device)
    else:
        result = initial_value.clone()
    for i in range(data.shape[1]):
        result += data[:, i, :].float()
    return result.to(data.dtype)


def _grouped_reduce(data: torch.Tensor, group_id: torch.Tensor) -> torch.Tensor:
    """Per token, sum the slots sharing a ``group_id`` in FP32 in slot order, round to ``data``'s dtype, store it at
    the group's last slot and zero the group's other slots. ``data`` ``[N, K, hidden]`` is not modified."""
    num_tokens, num_topk, hidden = data.shape
    device = data.device
    # A stable sort makes each group contiguous while keeping slot order inside it.
    group_id, src_indices = torch.sort(group_id, dim=-1, stable=True)
    flat_indices = (src_indices + torch.arange(num_tokens, device=device).unsqueeze(-1) * num_topk).flatten()
    data = data.reshape(-1, hidden)[flat_indices].view(num_tokens, num_topk, hidden)
    acc = torch.zeros((num_tokens, hidden), dtype=torch.float32, device=device)
    for i in range(num_topk):
        if i == num_topk - 1:
            is_break = torch.ones((num_tokens,), dtype=torch.bool, device=device)
        else:
            is_break = group_id[:, i] != group_id[:, i + 1]
        acc += data[:, i, :].float()
        ends = torch.where(is_break)[0]
        data[ends, i] = acc[ends].to(data.dtype)
        acc[ends] = 0.0
        data[torch.where(~is_break)[0], i] = 0.0
    result = torch.empty_like(data)
    result.view(-1, hidden)[flat_indices] = data.view(-1, hidden)
    return result.view(num_tokens, num_topk, hidden)


def combine(y: torch.Tensor, topk_idx: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """Reference (possibly multi-level) combine of ``y`` ``[N, K, hidden]`` routed by ``topk_idx`` ``[N, K]``,
    in either published signature: upstream DeepEP's ``combine(y, topk_idx, num_scaleout_ranks,
    num_scaleup_ranks, num_experts, bias, reduce_in_local, reduce_in_scaleup)`` or DeepEP-Ascend's
    ``combine(y, topk_idx, num_experts, bias, reduce_in_local)`` (no scale-out: one domain of the default
    group's ranks; ``bias`` may be a tuple of one or two).

    ``reduce_in_local``: first reduce the slots of each destination rank (``topk_idx // experts_per_rank``);
    ``reduce_in_scaleup``: then the slots of each scale-out node (``// (experts_per_rank * num_scaleup_ranks)``);
    each group's FP32 slot-order sum is rounded to ``y``'s dtype at its last slot (see ``_grouped_reduce``).
    Finally ``ordered_accumulate`` from the FP32 bias sum. ``(True, True)`` = hybrid, ``(True, False)`` =
    direct, ``(False, False)`` = no multiple reduction; ``(False, True)`` is invalid.
    """
    ascend_names = {"num_experts", "bias", "reduce_in_local"}
    if len(args) + len(kwargs) == 3 and set(kwargs) <= ascend_names:
        bound = dict(zip(("num_experts", "bias", "reduce_in_local"), args), **kwargs)
        num_scaleout_ranks, num_scaleup_ranks = 1, dist.get_world_size()
        num_experts, bias = bound["num_experts"], bound["bias"]
        reduce_in_local, reduce_in_scaleup = bound["reduce_in_local"], False
    else:
        names = (
            "num_scaleout_ranks",
            "num_scaleup_ranks",
            "num_experts",
            "bias",
            "reduce_in_local",
            "reduce_in_scaleup",
        )
        bound = dict(zip(names, args), **kwargs)
        missing = [n for n in names if n not in bound]
        if missing or len(bound) != len(names):
            raise TypeError(
                "deep_ep.utils.refs.combine: expected (y, topk_idx, num_scaleout_ranks, num_scaleup_ranks, "
                "num_experts, bias, reduce_in_local, reduce_in_scaleup) or DeepEP-Ascend's (y, topk_idx, "
                f"num_experts, bias, reduce_in_local), got {len(args)} positional and {sorted(kwargs)} keyword "
                "arguments after topk_idx"
            )
        num_scaleout_ranks, num_scaleup_ranks, num_experts, bias, reduce_in_local, reduce_in_scaleup = (
            bound[n] for n in names
        )
    if reduce_in_scaleup and not reduce_in_local:
        raise ValueError("deep_ep.utils.refs.combine: reduce_in_scaleup requires reduce_in_local")
    num_ranks = num_scaleout_ranks * num_scaleup_ranks
    num_experts_per_rank = num_experts // num_ranks
    if reduce_in_local:
        y = _grouped_reduce(y, topk_idx // num_experts_per_rank)
    if reduce_in_scaleup:
        y = _grouped_reduce(y, topk_idx // (num_experts_per_rank * num_scaleup_ranks))
    biases = bias if isinstance(bias, (tuple, list)) else (bias,)
    bias_sum = None
    for b in biases:
        if b is not None:
            bias_sum = b.float() if bias_sum is None else bias_sum + b.float()
    return ordered_accumulate(y, bias_sum)


__all__ = ["combine", "dispatch", "generate_pre_combine_data", "ordered_accumulate"]
