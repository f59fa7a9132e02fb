"""The ep family: expert-parallel dispatch and combine over ``torch.distributed`` (DeepEP's normal mode)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, result_type, schema_defaults
from torch_ascend_moe.distributed.groups import group_name_of

_layout = torch.ops.ascend_moe.ep_dispatch_layout.default
_dispatch = torch.ops.ascend_moe.ep_dispatch.default
_cached = torch.ops.ascend_moe.ep_dispatch_cached.default
_combine = torch.ops.ascend_moe.ep_combine.default
# The outputs by the names the schema gives them, looked up once here (torch.compile traces the wrappers, and a
# schema is not something it traces).
_Dispatched = result_type("ep_dispatch")
_Expanded = result_type("ep_expand")
_LowLatencyDispatched = result_type("ep_low_latency_dispatch")


class EPHandle(NamedTuple):
    """A dispatch's routing: what ``ep_combine`` and ``ep_dispatch_cached`` replay."""

    send_src: torch.Tensor  # [rows sent] source token of each send row (-1: padding), destination-major
    send_counts: torch.Tensor  # [R] rows sent to each rank
    recv_counts: torch.Tensor  # [R] rows received from each rank
    recv_gather: torch.Tensor  # [N] receive-buffer row of each output row (-1: padding)
    num_tokens: int
    group_name: str
    # The transport's own routing state (DeepEP's handle where DeepEP moved the rows; empty for ours), handed back
    # to the cached dispatch and the combine.
    backend_state: torch.Tensor | None = None


class EPDispatchOutput(NamedTuple):
    recv_x: torch.Tensor
    recv_x_scales: torch.Tensor | None
    recv_topk_idx: torch.Tensor
    recv_topk_weights: torch.Tensor | None
    num_recv_tokens_per_expert: torch.Tensor
    num_recv: torch.Tensor
    handle: EPHandle
    recv_src_idx: torch.Tensor  # [N] each row's token index on its source rank (-1: padding)


@schema_defaults
def ep_dispatch_layout(topk_idx: torch.Tensor, num_experts: int, num_ranks: int, ranks_per_node: int = FROM_SCHEMA):
    """``(num_tokens_per_rank [R], num_tokens_per_node, num_tokens_per_expert [E], is_token_in_rank [T, R])``,
    DeepEP's definitions (a token counts once per rank and once per node however many of its experts live there)."""
    return _layout(topk_idx, num_experts, num_ranks, ranks_per_node)


@schema_defaults
def ep_dispatch(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
    *,
    num_experts: int,
    group=None,
    x_scales: torch.Tensor | None = None,
    expert_alignment: int = FROM_SCHEMA,
    num_worst_tokens: int = FROM_SCHEMA,
    timeout_s: float = FROM_SCHEMA,
) -> EPDispatchOutput:
    """Send each token to every rank owning one of its experts (once per rank), DeepEP's normal dispatch.

    Rows arrive source-rank-major, then by ascending source token. ``recv_topk_idx`` holds local expert ids
    (-1 for experts elsewhere), ``recv_topk_weights`` the weights at those slots (0 elsewhere), and
    ``num_recv_tokens_per_expert`` the per-local-expert counts rounded up to ``expert_alignment``.
    ``num_worst_tokens > 0`` gives exactly that many rows (static shapes; padding rows are zero / -1,
    ``num_recv`` counts the real ones; ranks may differ in ``T``, except under CUDA graph capture); 0 gives
    exactly the received rows.
    Differentiable w.r.t. ``x`` (BF16/FP32) and ``topk_weights``.
    """
    name = group_name_of(group)
    out = _Dispatched(
        *_dispatch(
            x, x_scales, topk_idx, topk_weights, num_experts, name, expert_alignment, num_worst_tokens, timeout_s
        ),
    )
    handle = EPHandle(
        out.send_src, out.send_counts, out.recv_counts, out.recv_gather, x.shape[0], name, out.backend_state
    )
    return EPDispatchOutput(
        out.recv_x,
        out.recv_x_scales if x_scales is not None else None,
        out.recv_topk_idx,
        out.recv_topk_weights if topk_weights is not None else None,
        out.num_recv_tokens_per_expert,
        out.num_recv,
        handle,
        out.recv_src_idx,
    )


@schema_defaults
def ep_dispatch_cached(
    x: torch.Tensor, handle: EPHandle, x_scales: torch.Tensor | None = None, timeout_s: float = FROM_SCHEMA
):
    """Replay ``handle``'s routing with new rows: ``(recv_x, recv_x_scales or None)``."""
    recv_x, recv_scales = _cached(x, x_scales, *handle[:4], handle.group_name, timeout_s, handle.backend_state)
    return recv_x, (recv_scales if x_scales is not None else None)


@schema_defaults
def ep_combine(
    x: torch.Tensor,
    handle: EPHandle,
    topk_weights: torch.Tensor | None = None,
    bias: torch.Tensor | tuple | None = None,
    timeout_s: float = FROM_SCHEMA,
    copy_order: torch.Tensor | None = None,
):
    """Sum each token's returning copies (rows in ``handle``'s receive order), plus up to two biases, in FP32
    with one rounding: ``(combined_x [T, H], combined_topk_weights [T, K] or None)``. Unweighted, as DeepEP.
    Copies add in ascending source rank, or in ascending ``copy_order[t, r]`` (``[T, R]``) when given."""
    biases = tuple(bias) if isinstance(bias, (tuple, list)) else (bias,)
    biases = (*biases, None, None)[:2]
    combined, weights = _combine(
        x,
        topk_weights,
        biases[0],
        biases[1],
        *handle[:4],
        handle.num_tokens,
        handle.group_name,
        timeout_s,
        copy_order,
        handle.backend_state,
    )
    return combined, (weights if topk_weights is not None else None)


_expand = torch.ops.ascend_moe.ep_expand.default


class EPExpanded(NamedTuple):
    x: torch.Tensor  # [M, H] one row per (row, local expert), expert-major, blocks aligned, zero padding
    x_scales: torch.Tensor | None  # [M, S]
    weights: torch.Tensor | None  # [M] the (row, expert) pair's weight, 0 on padding
    expand_rows: torch.Tensor  # [N, K] each slot's expanded row (-1: not a local expert)
    psum: torch.Tensor  # [L] int32 block start + real rows (DeepEP V2's psum_num_recv_tokens_per_expert)
    counts: torch.Tensor  # [L] int32 real rows per local expert


@schema_defaults
def ep_expand(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
    *,
    num_local_experts: int,
    x_scales: torch.Tensor | None = None,
    expert_alignment: int = FROM_SCHEMA,
    num_rows: int = FROM_SCHEMA,
) -> EPExpanded:
    """DeepEP V2's GEMM-ready layout of dispatched rows (``do_expand``): one row per (row, local expert it
    selected), grouped by expert in receive order, expert ``e``'s block starting at
    ``align(psum[e - 1], expert_alignment)``. ``psum`` (or ``align``-ed block ends) is the m-grouped GEMMs'
    layout. ``num_rows > 0`` gives that many rows (static shapes). Differentiable w.r.t. ``x`` and
    ``topk_weights``; the adjoint is ``ep_reduce_slots``."""
    out = _Expanded(*_expand(x, x_scales, topk_idx, topk_weights, num_local_experts, expert_alignment, num_rows))
    return EPExpanded(
        out.expanded_x,
        out.expanded_x_scales if x_scales is not None else None,
        out.expanded_weights if topk_weights is not None else None,
        out.expand_rows,
        out.psum,
        out.counts,
    )


def ep_reduce_slots(rows: torch.Tensor, index: torch.Tensor, bias=None, weights: torch.Tensor | None = None):
    """``out[j] = round(bias_0[j] + bias_1[j] + w[index[j, 0]]·rows[index[j, 0]] + ...)`` over the slots with
    ``index >= 0`` (-1 marks an empty slot), in slot order, accumulated in FP32 (FP64 for FP64 rows) and rounded
    once: DeepEP V2's ``ordered_accumulate`` (the local reduction of an expanded combine; the adjoint of
    ``ep_expand``). ``rows`` ``[M, H]``, ``index`` ``[N, K]``, ``bias`` None, ``[N, H]`` or a pair, ``weights``
    ``[M]`` (a MoE layer's routing weights, applied in the accumulator's precision; V2's combine takes none).
    Plain tensor ops: differentiable, traceable, no host sync."""
    biases = [b for b in (bias if isinstance(bias, (tuple, list)) else (bias,)) if b is not None]
    if not biases:
        # moe_unpermute is this sum with per-slot weights (slot order from zero, one rounding), an op with a
        # C++ CPU kernel that widens rows as it reads them.
        from torch_ascend_moe.ops.moe_routing import moe_unpermute

        slot_w = None if weights is None else torch.cat([weights, weights.new_zeros(1)])[index]
        return moe_unpermute(rows, index.int(), slot_w)
    acc_t = torch.float64 if rows.dtype == torch.float64 else torch.float32
    n, h = index.shape[0], rows.shape[-1]
    acc = rows.new_zeros(n, h, dtype=acc_t)
    for b in biases:
        acc = acc + b.to(acc_t)
    # -1 slots read the appended zero row (index -1 is the last row): no boolean indexing, no sizes needed.
    spare = torch.cat([rows, rows.new_zeros(1, h)])
    scale = None if weights is None else torch.cat([weights, weights.new_zeros(1)]).to(acc_t)
    for k in range(index.shape[1]):
        term = spare[index[:, k]].to(acc_t)
        acc = acc + (term if scale is None else scale[index[:, k]].unsqueeze(1) * term)
    return acc.to(rows.dtype)


def ep_copy_order(topk_idx: torch.Tensor, num_experts: int, num_ranks: int) -> torch.Tensor:
    """``[T, R]``: the last top-k slot each rank serves for each token (-1 where none), ``ep_combine``'s
    ``copy_order`` for DeepEP V2's reduction order (rank partials added in slot order, each at its rank's last
    slot)."""
    idx = topk_idx.long()
    t, k = idx.shape
    owner = torch.where(idx >= 0, idx // (num_experts // num_ranks), num_ranks)
    lanes = torch.arange(k, device=idx.device).expand(t, k)
    order = torch.full((t, num_ranks + 1), -1, dtype=torch.int64, device=idx.device)
    return order.scatter_reduce(1, owner, lanes, reduce="amax")[:, :num_ranks]


_ll_dispatch = torch.ops.ascend_moe.ep_low_latency_dispatch.default
_ll_combine = torch.ops.ascend_moe.ep_low_latency_combine.default


class EPLowLatencyHandle(NamedTuple):
    src_info: torch.Tensor  # [L, R * T_max] source token of each row (-1: empty)
    layout_range: torch.Tensor  # [L, R] (begin << 32) | count of each source's rows
    num_max_dispatch_tokens_per_rank: int
    hidden: int
    num_experts: int
    group_name: str
    # The dispatch's backend_state (Ascend MC2's routing state; empty elsewhere), handed to the combine.
    backend_state: torch.Tensor | None = None


@schema_defaults
def ep_low_latency_dispatch(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    num_max_dispatch_tokens_per_rank: int,
    num_experts: int,
    *,
    group=None,
    use_fp8: bool = FROM_SCHEMA,
    round_scale: bool = FROM_SCHEMA,
    use_ue8m0: bool = FROM_SCHEMA,
    timeout_s: float = FROM_SCHEMA,
):
    """DeepEP's low-latency dispatch: one message per (token, expert) into ``[L, R * T_max, H]`` per-expert
    buffers (rows ``[0, recv_count[i])`` valid, the rest unspecified; static shapes). Our transport orders an
    expert's rows source-rank-major then by ascending token; DeepEP's kernels (CUDA, where installed) in arrival
    order, as upstream: ``handle.src_info`` / ``layout_range`` say where each row came from, whatever the order.
    Returns ``(recv_x or (fp8, scales), recv_count [L], handle)``; differentiable when not FP8."""
    name = group_name_of(group)
    out = _LowLatencyDispatched(
        *_ll_dispatch(
            x,
            topk_idx,
            num_max_dispatch_tokens_per_rank,
            num_experts,
            name,
            use_fp8,
            round_scale,
            use_ue8m0,
            None,
            timeout_s,
        ),
    )
    handle = EPLowLatencyHandle(
        out.src_info,
        out.layout_range,
        num_max_dispatch_tokens_per_rank,
        x.shape[1],
        num_experts,
        name,
        out.backend_state,
    )
    return ((out.recv_x, out.recv_x_scales) if use_fp8 else out.recv_x), out.recv_count, handle


@schema_defaults
def ep_low_latency_combine(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor,
    handle: EPLowLatencyHandle,
    timeout_s: float = FROM_SCHEMA,
) -> torch.Tensor:
    """``combined[t] = sum_k topk_weights[t, k] * y_k(t)`` (valid slots, in slot order, FP32): weighted, as
    DeepEP's low-latency combine. ``x`` is ``[L, R * T_max, H]`` in the dispatch's layout."""
    return _ll_combine(
        x,
        topk_idx,
        topk_weights,
        handle.src_info,
        handle.layout_range,
        handle.num_max_dispatch_tokens_per_rank,
        handle.group_name,
        timeout_s,
        handle.backend_state,
    )
