"""The ep family's kernels: expert-parallel dispatch / combine on ``torch.distributed`` (gloo on CPU, NCCL on
CUDA, HCCL on Ascend), device-generic Python: registered on CPU here, on CUDA / NPU with the portable kernels.

A dispatch moves ``x`` rows in one ``all_to_all_single`` (received straight into ``recv_x`` when compact) and
a narrow metadata row per token (scales, ``topk_idx`` / ``topk_weights``, index + 1; 0 marks padding) in a
second, both in flight together. Before moving data, every rank ``all_gather``s one fixed-length header (the
op, its shapes, dtypes, options, local validation result and, for a compact dispatch, its send counts), so a
mismatch between ranks, different ops, or a bad argument on one rank raises a clear error on every rank
instead of a hang. Every collective waits at most ``timeout_s``: a rank that never arrives produces an error
on the others.

While a CUDA graph is being captured, the static ops (``num_worst_tokens`` dispatch, combine / cached
dispatch of its handle, low-latency dispatch / combine) skip the header and make no host sync: equal
splits, scatters into a spare row instead of boolean masks, device-side asserts instead of raised errors.

Receive order (DeepEP V1's): source-rank-major, then ascending source token index, identical on every
backend. Combine adds biases first, then each source rank's copies in ascending rank order, in FP32 (FP64
for FP64 rows), and rounds once.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.distributed import capture, exchange
from torch_ascend_moe.distributed.groups import resolve_group
from torch_ascend_moe.meta import ep as meta
from torch_ascend_moe.quant.encodings import FP8_MAX

# An absent optional (no scales, no weights) comes back as an empty int32 [N, 0] placeholder: not a
# floating output, so it never looks differentiable.
_ABSENT = torch.int32

# The transport a header names (every rank must move rows the same way: a rank where DeepEP is installed and one
# where it is not raise on both instead of waiting in different collectives).
OURS, DEEP_EP, DEEP_EP_V2 = 0, 1, 2
_TRANSPORT = "the transport (0: torch.distributed, 1: DeepEP's Buffer, 2: DeepEP's ElasticBuffer)"


@portable_kernel("ep_dispatch_layout")
def layout(topk_idx, num_experts, num_ranks, ranks_per_node):
    """DeepEP's get_dispatch_layout (specs §3)."""
    meta.layout_signature(topk_idx, num_experts, num_ranks, ranks_per_node)
    if not capture.capturing(topk_idx.device):
        bad = (topk_idx < -1) | (topk_idx >= num_experts)
        if bool(bad.any()):
            raise ValueError(
                f"{meta.LAYOUT}: argument 'topk_idx' values: expected expert ids in [-1, {num_experts}), got "
                f"{int(topk_idx[bad][0])}"
            )
    return layout_of(topk_idx.long(), num_experts, num_ranks, ranks_per_node)


def layout_of(idx, num_experts, num_ranks, ranks_per_node=8):
    """layout of valid ids, without host syncs (scatters with a spare slot, no boolean indexing): capturable.
    ``(num_tokens_per_rank, num_tokens_per_node, num_tokens_per_expert, is_token_in_rank)``, int32 counts."""
    t = idx.shape[0]
    valid = idx >= 0
    per_expert = torch.zeros(num_experts + 1, dtype=torch.int64, device=idx.device)
    # reshape, not view: topk_idx may come with any strides.
    per_expert.index_add_(0, torch.where(valid, idx, num_experts).reshape(-1), torch.ones_like(idx).reshape(-1))
    rank_of = torch.where(valid, idx // (num_experts // num_ranks), num_ranks)
    in_rank = torch.zeros(t, num_ranks + 1, dtype=torch.bool, device=idx.device).scatter_(1, rank_of, True)
    in_rank = in_rank[:, :num_ranks].clone(memory_format=torch.contiguous_format)
    nodes = max(1, num_ranks // ranks_per_node)
    if num_ranks % ranks_per_node == 0:
        in_node = in_rank.view(t, nodes, ranks_per_node).any(-1)
    else:  # fewer ranks than one node holds: a single node
        in_node = in_rank.any(1, keepdim=True)
    return (
        in_rank.sum(0).int(),
        in_node.sum(0).int(),
        per_expert[:num_experts].int(),
        in_rank,
    )


# ---- collectives with a deadline ----


def _checked(op: str, args, signature) -> int:
    """``signature(args)`` (the fake's checks) run on every rank with one agreed verdict: the world size R."""
    return exchange.checked(op, args.group_name, args.x, args.timeout_s, lambda: signature(args))


@portable_kernel
def ep_dispatch(args):
    op = meta.DISPATCH
    r = _checked(op, args, meta.dispatch_signature)
    group = resolve_group(op, args.group_name)
    rank, device = group.rank(), args.x.device
    t, h = args.x.shape
    k = args.topk_idx.shape[1]
    local_experts = args.num_experts // r
    static = args.num_worst_tokens > 0
    capturing = capture.capturing(device)
    # Bad ids travel as -1 (the header exchange must still happen, so every rank can raise).
    bad, counts, send_src, meta_rows = _send_plan(
        args.topk_idx, args.num_experts, r, static, args.x_scales, args.topk_weights
    )
    bad_ids_message = bad_ids(args)
    fields = dispatch_fields(args, OURS)
    if capturing and not static:
        raise ValueError(
            f"{op}: argument 'num_worst_tokens' value: expected a positive static row count while a CUDA graph is "
            "captured (a compact dispatch's row count is data-dependent, read on the host), got 0"
        )
    if capturing:
        # No header while a graph is captured (reading it is a host sync): bad ids trip a device-side assert.
        torch._assert_async(bad == 0, bad_ids_message.format(ranks=[rank]))
    else:
        errors = {"topk_idx": (bool(bad), bad_ids_message)}
        # A static dispatch sends every rank T slots, so its header carries T (ranks may differ, as DeepEP's).
        sent = torch.full((r,), t, dtype=torch.int64) if static else counts
        table = exchange.exchange_header(op, group, device, fields, sent, errors, args.timeout_s)
    if static:
        # Every rank sends every other rank one slot per token (-1 = padding), so the send side needs no count.
        # The receive side takes each source's T from the header; while a graph is captured there is none, and
        # the splits are equal: every rank must then pass the same T (the graph's static shapes).
        send_counts = torch.full((r,), t, dtype=torch.int64, device=device)
        if capturing:
            recv_counts = send_counts.clone()
            in_splits = out_splits = None
            recv_rows = r * t
        else:
            recv_counts = table[:, rank].to(device).clone(memory_format=torch.contiguous_format)
            in_splits, out_splits = [t] * r, recv_counts.tolist()
            recv_rows = sum(out_splits)
    else:
        send_counts = counts
        recv_counts = table[:, rank].to(device).clone(memory_format=torch.contiguous_format)
        in_splits, out_splits = send_counts.tolist(), recv_counts.tolist()
        recv_rows = sum(out_splits)
    # Two all-to-alls: x rows alone (received straight into recv_x when compact: no repacking of the wide
    # data), and one narrow row per token of metadata (_send_plan's).
    recv_x = exchange.new_rows(args.x, recv_rows, h)
    recv_meta = meta_rows.new_empty(recv_rows, meta_rows.shape[1])
    exchange.all_to_all_rows(
        op,
        group,
        [(recv_x, args.x), (recv_meta, meta_rows)],
        out_splits,
        in_splits,
        args.timeout_s,
        index=send_src,
        padded=static,
        send_rows=None if capturing else table,
    )
    if static:
        valid = recv_meta[:, -8:].contiguous().view(torch.int64).view(-1) > 0  # the tag: 0 on padding rows
        n_valid = valid.sum().view(1)
        if capturing:
            torch._assert_async(
                (n_valid <= args.num_worst_tokens).all(),
                f"{op}: argument 'num_worst_tokens' value: expected at least the rows every rank receives, got "
                f"{args.num_worst_tokens} (rank {rank} receives more; rows are never dropped)",
            )
        else:
            overflow = (n_valid > args.num_worst_tokens).to(torch.int64)
            exchange.all_reduce_max(op, group, overflow, args.timeout_s)
            if bool(overflow):
                raise ValueError(static_overflow(op, args.num_worst_tokens, rank, int(n_valid)))
        order = torch.sort((~valid).to(torch.int8), stable=True).indices
        width = min(args.num_worst_tokens, recv_rows)
        pos = torch.arange(args.num_worst_tokens, device=device)
        recv_gather = torch.full((args.num_worst_tokens,), -1, dtype=torch.int64, device=device)
        recv_gather[:width] = torch.where(pos[:width] < n_valid, order[:width], -1)
        recv_x = exchange.take_rows(recv_x, recv_gather, True)
        recv_meta = exchange.take_rows(recv_meta, recv_gather, True)
    else:
        recv_gather = torch.arange(recv_rows, device=device)
        n_valid = torch.full((1,), recv_rows, dtype=torch.int64, device=device)  # every compact row is valid
    n = recv_gather.shape[0]
    scales, recv_topk_idx, weights, per_expert, src = _unpack(
        recv_meta,
        exchange.row_bytes(args.x_scales) if args.x_scales is not None else 0,
        k,
        args.topk_weights.element_size() if args.topk_weights is not None else 0,
        rank * local_experts,
        local_experts,
        args.expert_alignment,
    )
    return (
        recv_x,
        # A fresh placeholder for each absent output: a custom op's outputs may not alias one another.
        absent(args.x, n)
        if args.x_scales is None
        else scales.view(args.x_scales.dtype).view(n, args.x_scales.shape[1]),
        recv_topk_idx,
        absent(args.x, n) if args.topk_weights is None else weights.view(args.topk_weights.dtype).view(n, k),
        per_expert,
        n_valid,
        send_src,
        send_counts,
        recv_counts,
        recv_gather,
        src,
        no_backend_state(device),
    )


def dispatch_fields(args, transport: int) -> dict:
    """What every rank's ``ep_dispatch`` must agree on (the header's fields): its rows', then its routing's."""
    return {
        **cached_fields(args, transport),
        "topk_idx's K": args.topk_idx.shape[1],
        "num_experts": args.num_experts,
        "topk_weights (given, dtype)": -1
        if args.topk_weights is None
        else exchange.dtype_code(args.topk_weights.dtype),
        "num_worst_tokens": args.num_worst_tokens,
        "expert_alignment": args.expert_alignment,
    }


def cached_fields(args, transport: int) -> dict:
    """What every rank's ``ep_dispatch_cached`` must agree on: the transport and its rows' shapes and dtypes."""
    return {
        _TRANSPORT: transport,
        "x's row bytes": args.x.shape[1] * args.x.element_size(),
        "x's dtype": exchange.dtype_code(args.x.dtype),
        "x_scales' columns": -1 if args.x_scales is None else args.x_scales.shape[1],
        "x_scales' dtype": -1 if args.x_scales is None else exchange.dtype_code(args.x_scales.dtype),
    }


def combine_fields(args, transport: int) -> dict:
    return {
        _TRANSPORT: transport,
        "x's row bytes": args.x.shape[1] * args.x.element_size(),
        "x's dtype": exchange.dtype_code(args.x.dtype),
        "topk_weights (K, dtype)": -1
        if args.topk_weights is None
        else args.topk_weights.shape[1] * 1000 + args.topk_weights.element_size(),
    }


def bad_ids(args) -> str:
    """The error for expert ids out of range on some ranks (``{ranks}``: which)."""
    return (
        f"{meta.DISPATCH}: argument 'topk_idx' values: expected expert ids in [-1, {args.num_experts}) on every "
        "rank, got ids out of range on rank(s) {ranks}"
    )


def static_overflow(op: str, num_worst_tokens: int, rank: int, received) -> str:
    return (
        f"{op}: argument 'num_worst_tokens' value: expected at least the rows every rank receives, got "
        f"{num_worst_tokens} (rank {rank} receives {received}; rows are never dropped)"
    )


def per_local_expert(local_ids: torch.Tensor, mine: torch.Tensor, local_experts: int, alignment: int) -> torch.Tensor:
    """Slots per local expert (``mine``: the slot is this rank's), rounded up to ``alignment``: int32 [L], no
    host sync (a spare slot takes the others)."""
    per_expert = torch.zeros(local_experts + 1, dtype=torch.int64, device=local_ids.device)
    where = torch.where(mine, local_ids, local_experts).reshape(-1)
    per_expert.index_add_(0, where, torch.ones_like(where))
    return ((per_expert[:local_experts] + alignment - 1) // alignment * alignment).int()


def absent(like: torch.Tensor, n: int) -> torch.Tensor:
    return like.new_empty(n, 0, dtype=_ABSENT)


def _send_plan(topk_idx, num_experts: int, r: int, padded: bool, x_scales, topk_weights):
    """A dispatch's send side: ``(bad, counts, send_src, meta)``. ``bad`` [1]: how many ids lie outside
    ``[-1, E)``; ``counts`` [R]: tokens with an expert on rank d; ``send_src``: the token of each row sent,
    destination-major then ascending token (``padded``: ``[R * T]``, -1 where the token has no expert on that rank);
    ``meta`` [T, W] uint8: per token its scales | ids (bad ones as -1, int64) | weights bytes, zero padding to a
    multiple of 8 bytes, then its index + 1 as int64 (the tag; 0 marks padding rows)."""
    if capture.host_kernels(topk_idx.device):
        counts, send_src, meta = torch.ops.ascend_moe_kernels.ep_dispatch_plan(
            topk_idx, num_experts, r, padded, x_scales, topk_weights
        )
        return counts[r:], counts[:r], send_src, meta
    return _send_plan_portable(topk_idx, num_experts, r, padded, x_scales, topk_weights)


def _send_plan_portable(topk_idx, num_experts: int, r: int, padded: bool, x_scales, topk_weights):
    """_send_plan with tensor ops (CUDA / NPU, capturable when ``padded``): bitwise the CPU kernel's results."""
    t, device = topk_idx.shape[0], topk_idx.device
    ids = topk_idx.long()
    out_of_range = (ids < -1) | (ids >= num_experts)
    ids = torch.where(out_of_range, -1, ids)
    _, _, _, in_rank = layout_of(ids, num_experts, r)
    if padded:
        send_src = torch.where(in_rank.t(), torch.arange(t, device=device), -1).reshape(-1)
    else:
        pairs = in_rank.t().nonzero()  # (destination, token), destination-major then ascending token
        send_src = pairs[:, 1].clone(memory_format=torch.contiguous_format)
    parts = [] if x_scales is None else [exchange.as_bytes(x_scales)]
    parts.append(exchange.as_bytes(ids))
    if topk_weights is not None:
        parts.append(exchange.as_bytes(topk_weights))
    parts = exchange.pad8(parts)  # the 8-byte tag keeps the width a multiple of 8
    parts.append(exchange.as_bytes(torch.arange(1, t + 1, device=device).view(t, 1)))
    meta = torch.cat(parts, dim=1)
    return out_of_range.sum().view(1), in_rank.sum(0).long(), send_src, meta


def _unpack(meta, scale_bytes: int, k: int, weight_size: int, first_expert: int, local_experts: int, alignment: int):
    """A dispatch's receive side, from the metadata rows it received (``_send_plan``'s; tag 0: a padding row):
    ``(scales, recv_topk_idx, weights, per_expert, src)``. ``scales`` [N, scale_bytes] uint8; ``recv_topk_idx``
    [N, K]: ids of this rank's experts (``first_expert`` onwards) as local ids, else -1; ``weights`` [N, K *
    weight_size] uint8: those slots' weights, zero on the others; ``per_expert`` [L] int32: slots per local expert
    rounded up to ``alignment``; ``src`` [N]: each row's token index on its source rank, -1 on padding."""
    if capture.host_kernels(meta.device):
        return torch.ops.ascend_moe_kernels.ep_dispatch_unpack(
            meta, scale_bytes, k, weight_size, first_expert, local_experts, alignment
        )
    return _unpack_portable(meta, scale_bytes, k, weight_size, first_expert, local_experts, alignment)


def _unpack_portable(meta, scale_bytes, k, weight_size, first_expert, local_experts, alignment):
    """_unpack with tensor ops (CUDA / NPU, no host syncs): bitwise the CPU kernel's results."""
    n = meta.shape[0]
    ids_at, weights_at = scale_bytes, scale_bytes + 8 * k
    tag = meta[:, -8:].contiguous().view(torch.int64).view(n)
    ids = meta[:, ids_at:weights_at].contiguous().view(torch.int64).view(n, k)
    local = ids - first_expert
    mine = (tag > 0).unsqueeze(1) & (ids >= 0) & (local >= 0) & (local < local_experts)
    weights = meta[:, weights_at : weights_at + k * weight_size]
    weights = torch.where(mine.repeat_interleave(weight_size, dim=1), weights, 0)  # bytes: +0.0 in any float
    per_expert = per_local_expert(local, mine, local_experts, alignment)
    return (
        meta[:, :scale_bytes].clone(memory_format=torch.contiguous_format),
        torch.where(mine, local, -1),
        weights,
        per_expert,
        tag - 1,
    )


class _Route(NamedTuple):
    """How a handle's rows move: splits (None = equal splits), buffer sizes, whether the handle is compact."""

    in_splits: list[int] | None  # rows this rank's send buffer holds per destination (dispatch direction)
    out_splits: list[int] | None  # rows it receives per source (dispatch direction)
    rows_out: int  # rows of the dispatch's receive buffer
    rows_in: int  # rows of the dispatch's send buffer
    compact_recv: bool  # recv_gather is the identity: outputs are the receive buffer itself
    padded_send: bool  # send_src holds -1 padding
    send_rows: torch.Tensor | None  # [R, R]: rows rank s sends rank d in the dispatch direction (None: capturing)


def handle_route(op, group, device, send_src, send_counts, recv_counts, recv_gather, fields, timeout_s) -> _Route:
    """Check a dispatch handle on every rank (its counts must pair up: rank s sends rank d what d expects from s)
    and return its route. While a CUDA graph is captured nothing is read on the host: only a static handle
    (equal splits, every rank the same T) can be replayed then, and nothing is checked."""
    r, rank = group.size(), group.rank()
    if capture.capturing(device):
        rows = send_src.shape[0]  # static: R * T rows each way
        return _Route(None, None, rows, rows, False, True, None)
    table = exchange.exchange_header(
        op, group, device, fields, torch.cat([send_counts, recv_counts]).cpu(), {}, timeout_s
    )
    sends = table[:, :r]  # sends[s, d]
    recvs = table[:, r:]  # recvs[d, s]
    if not torch.equal(sends, recvs.t()):
        raise ValueError(
            f"{op}: the handles do not pair up across ranks (rank s's send_counts[d] must equal rank d's "
            f"recv_counts[s]); rank {rank} has send_counts {send_counts.tolist()}, recv_counts "
            f"{recv_counts.tolist()}: pass every rank the handle of the same dispatch"
        )
    in_splits, out_splits = send_counts.tolist(), recv_counts.tolist()
    rows_out = sum(out_splits)
    compact = recv_gather.shape[0] == rows_out and torch.equal(recv_gather, torch.arange(rows_out, device=device))
    return _Route(in_splits, out_splits, rows_out, sum(in_splits), compact, bool((send_src < 0).any()), sends)


@portable_kernel
def ep_dispatch_cached(args):
    op = meta.CACHED
    _checked(op, args, meta.cached_signature)
    group = resolve_group(op, args.group_name)
    device = args.x.device
    fields = cached_fields(args, OURS)
    route = handle_route(
        op, group, device, args.send_src, args.send_counts, args.recv_counts, args.recv_gather, fields, args.timeout_s
    )
    n = args.recv_gather.shape[0]
    pairs = [(args.x, args.x.new_empty(route.rows_out, args.x.shape[1]))]
    if args.x_scales is not None:
        pairs.append((args.x_scales, args.x_scales.new_empty(route.rows_out, args.x_scales.shape[1])))
    exchange.all_to_all_rows(
        op,
        group,
        [(out, rows) for rows, out in pairs],
        route.out_splits,
        route.in_splits,
        args.timeout_s,
        index=args.send_src,
        padded=route.padded_send,
        send_rows=route.send_rows,
    )
    received = [out if route.compact_recv else exchange.take_rows(out, args.recv_gather, True) for _, out in pairs]
    recv_scales = received[1] if args.x_scales is not None else absent(args.x, n)
    return received[0], recv_scales


@portable_kernel
def ep_combine(args):
    op = meta.COMBINE
    _checked(op, args, meta.combine_signature)
    group = resolve_group(op, args.group_name)
    device = args.x.device
    fields = combine_fields(args, OURS)
    # The reverse route: what this rank received it now sends back.
    route = handle_route(
        op, group, device, args.send_src, args.send_counts, args.recv_counts, args.recv_gather, fields, args.timeout_s
    )
    # Rows go back in the dispatch's receive-buffer order: a compact handle's rows already are (no copy).
    sends = [args.x] if args.topk_weights is None else [args.x, args.topk_weights]
    if not route.compact_recv:
        sends = [exchange.place_rows(rows, args.recv_gather, route.rows_out) for rows in sends]
    received = exchange.received_blocks(
        op,
        group,
        sends,
        route.rows_in,
        route.in_splits,
        route.out_splits,
        args.timeout_s,
        send_rows=None if route.send_rows is None else route.send_rows.t(),  # what came in goes back
    )
    dest = args.send_src
    if args.copy_order is not None:
        # The reduction adds a token's copies in row order: put the rows in copy_order first (a stable sort, so
        # equal keys keep ascending rank). Send rows are destination-major: row i went to the rank whose
        # cumulative count first exceeds i (no host sync).
        n_rows = args.send_src.shape[0]
        ends = torch.cumsum(args.send_counts, 0)
        rank_of = torch.searchsorted(ends, torch.arange(n_rows, device=device), right=True).clamp(max=group.size() - 1)
        key = args.copy_order.long()[args.send_src.clamp(min=0), rank_of] if n_rows else args.send_src
        visit = torch.sort(key, stable=True).indices
    else:
        visit = None
    out = _reduce_rows(received[0], dest, args.num_tokens, args.bias_0, args.bias_1, group.size(), visit)
    if args.topk_weights is None:
        return out, args.x.new_empty(args.num_tokens, 0, dtype=_ABSENT)
    return out, _reduce_rows(received[1], dest, args.num_tokens, None, None, group.size(), visit)


def _reduce_rows(blocks, dest, num_tokens, bias_0, bias_1, passes, visit=None):
    """``out[t] = round(0 + bias_0[t] + bias_1[t] + rows[i] + ...)`` over the rows ``i`` with ``dest[i] == t``
    in ascending ``i`` (= ascending source rank), or in the order of the permutation ``visit``, accumulated in
    FP32 (FP64 for FP64 rows); at most ``passes`` rows per token. ``rows`` is the concatenation of ``blocks``."""
    if capture.host_kernels(blocks[0].device):
        out = exchange.new_rows(blocks[0], num_tokens, *blocks[0].shape[1:])  # 256 KiB or more: reused pages
        return torch.ops.ascend_moe_kernels.ep_combine_reduce.out(
            blocks, dest, num_tokens, bias_0, bias_1, visit, out=out
        )
    rows = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    if visit is not None:
        rows, dest = exchange.take_rows(rows, visit, False), dest[visit]
    return _reduce_rows_portable(rows, dest, num_tokens, bias_0, bias_1, passes)


def _reduce_rows_portable(rows, dest, num_tokens, bias_0, bias_1, passes):
    """_reduce_rows with tensor ops (CUDA / NPU): bitwise the same as the CPU kernel."""
    acc_t = torch.float64 if rows.dtype == torch.float64 else torch.float32
    out = torch.zeros(num_tokens, rows.shape[1], dtype=acc_t, device=rows.device)
    for b in (bias_0, bias_1):
        if b is not None:
            out += b.to(acc_t)
    # Pass j adds every token's j-th row (in ascending row order), so each token's sum runs in row order and
    # index_add_ never sees a token twice in one pass. Rows of other passes and dest = -1 go to a spare row T.
    # A fixed pass count (rows per token <= ranks) and no boolean indexing keep this free of host syncs.
    n = dest.shape[0]
    order = torch.sort(torch.where(dest >= 0, dest, num_tokens), stable=True)
    first = torch.searchsorted(order.values, order.values, right=False)
    occurrence = torch.empty_like(dest)
    occurrence[order.indices] = torch.arange(n, device=rows.device) - first
    spare = torch.cat([out, out.new_zeros(1, out.shape[1])])
    wide = rows.to(acc_t)
    for j in range(passes):
        target = torch.where((occurrence == j) & (dest >= 0), dest, num_tokens)
        spare.index_add_(0, target, wide)
    out = spare[:num_tokens]
    return out.to(rows.dtype)


# ---- expanded layout (DeepEP V2's do_expand) ----


@portable_kernel
def ep_expand(args):
    """One row per (row, local expert) slot, expert-major, each block aligned; no host sync when ``num_rows``
    is given (the static capacity) and no boolean indexing: scatters land -1 slots in a spare row."""
    op = meta.EXPAND
    meta.expand_signature(args)
    device = args.x.device
    n, k = args.topk_idx.shape
    local, align = args.num_local_experts, args.expert_alignment
    idx = args.topk_idx.long()
    if not capture.capturing(device):
        bad = (idx < -1) | (idx >= local)
        if bool(bad.any()):
            raise ValueError(
                f"{op}: argument 'topk_idx' values: expected local expert ids in [-1, {local}), got {int(idx[bad][0])}"
            )
    valid = (idx >= 0) & (idx < local)
    flat = torch.where(valid, idx, local).reshape(-1)  # invalid slots sort after every expert (any strides)
    counts = torch.zeros(local + 1, dtype=torch.int64, device=device)
    counts.index_add_(0, flat, torch.ones_like(flat))
    counts = counts[:local]
    aligned = (counts + align - 1) // align * align
    starts = torch.cumsum(aligned, 0) - aligned
    if args.num_rows > 0:
        m = args.num_rows
        if capture.capturing(device):
            torch._assert_async((aligned.sum() <= m), f"{op}: argument 'num_rows' value: too small for the layout")
        elif int(aligned.sum()) > m:
            raise ValueError(
                f"{op}: argument 'num_rows' value: expected at least the layout's {int(aligned.sum())} rows "
                f"(each expert's count aligned up to {align}), got {m}"
            )
    else:
        m = int(aligned.sum())
    # Slots in (expert, row, slot) order: a stable sort by expert keeps the receive order inside each block.
    order = torch.sort(flat, stable=True)
    first = torch.searchsorted(order.values, order.values, right=False)
    rank_in_block = torch.arange(n * k, device=device) - first
    start_of = torch.cat([starts, starts.new_zeros(1)])[order.values]
    dest_sorted = torch.where(order.values < local, start_of + rank_in_block, -1)
    expand_rows = torch.empty_like(dest_sorted)
    expand_rows[order.indices] = dest_sorted
    expand_rows = expand_rows.view(n, k)
    # Each expanded row's source row and slot (-1: padding), by a scatter into a spare last row.
    target = torch.where(valid, expand_rows, m).reshape(-1)
    slot_of = torch.full((m + 1,), -1, dtype=torch.int64, device=device)
    slot_of.scatter_(0, target, torch.arange(n * k, device=device))
    slot_of = slot_of[:m]
    src = torch.where(slot_of >= 0, slot_of // max(k, 1), -1)
    # Exact rows without alignment padding have no -1 source: skip the zeroing pass.
    padded = not (align == 1 and args.num_rows == 0)
    expanded_x = exchange.take_rows(args.x, src, padded)
    if args.x_scales is not None:
        expanded_scales = exchange.take_rows(args.x_scales, src, padded)
    else:
        expanded_scales = args.x.new_empty(m, 0, dtype=_ABSENT)
    if args.topk_weights is not None:
        w = args.topk_weights.reshape(-1)
        expanded_w = torch.where(slot_of >= 0, w[slot_of.clamp(min=0)] if w.numel() else w.new_zeros(m), 0)
    else:
        expanded_w = args.x.new_empty(0, dtype=_ABSENT)
    return expanded_x, expanded_scales, expanded_w, expand_rows, (starts + counts).int(), counts.int()


# ---- low-latency mode ----


def _ll_cast(x: torch.Tensor, round_scale: bool, use_ue8m0: bool):
    """DeepEP's per-128-channel FP8 cast: (E4M3 [T, H], scales). ``scale = 448 / amax`` (amax floored at 1e-4),
    stored ``scale_inv = amax * (1 / 448)``; ``round_scale`` makes ``scale_inv`` a power of two (rounded up) and
    ``scale = 1 / scale_inv``; ``use_ue8m0`` stores its exponent byte, 4 per int32."""
    t, h = x.shape
    groups = x.float().reshape(t, h // meta.LL_BLOCK, meta.LL_BLOCK)  # any strides
    amax = groups.abs().amax(-1).clamp(min=1e-4)
    # DeepEP's FP32 arithmetic exactly (csrc/kernels/legacy/utils.cuh, calculate_fp8_scales): scale_inv is amax
    # times the FP32 constant 1/448 (not amax / 448: an ulp apart), scale a true division (torch's ``448 / t`` is a
    # reciprocal times 448: a code apart on some values), round_scale's power of two from the bits
    # (fast_log2_ceil / fast_pow2: exact, where log2 on the device is not).
    prod = amax * torch.tensor(1 / FP8_MAX, dtype=torch.float32)
    if round_scale:
        bits = prod.view(torch.int32)
        exp = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).int()
        scale = ((127 - exp) << 23).view(torch.float32)
        scale_inv = ((exp + 127) << 23).view(torch.float32)
    else:
        scale, scale_inv = torch.full_like(amax, FP8_MAX) / amax, prod
    data = (groups * scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).view(t, h)
    if use_ue8m0:
        codes = ((scale_inv.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
        return data, codes.view(t, -1, 4).contiguous().view(torch.int32).view(t, -1)
    return data, scale_inv


def ll_dispatch_checks(args, extra: torch.Tensor | None = None, transport: int = OURS):
    """The low-latency dispatch's checks, the same on every backend: signature, ids, and the header every rank
    exchanges (shapes and options agree; a bad id on any rank fails every rank); skipped while capturing (device
    asserts instead). Returns ``(group, ranks, ids with out-of-range ones as -1, the ranks' ``extra`` ints or
    None)``."""
    op = meta.LL_DISPATCH
    t_max = args.num_max_dispatch_tokens_per_rank
    r = _checked(op, args, meta.ll_dispatch_signature)
    group = resolve_group(op, args.group_name)
    device = args.x.device
    t, h = args.x.shape
    k = args.topk_idx.shape[1]
    idx = args.topk_idx.long()
    out_of_range = (idx < -1) | (idx >= args.num_experts)
    sorted_ids = torch.sort(torch.where(idx >= 0, idx, -1 - torch.arange(k, device=device)), dim=1).values
    duplicates = (sorted_ids[:, 1:] == sorted_ids[:, :-1]).any() if k > 1 else torch.zeros((), dtype=torch.bool)
    bad_ids_message = (
        f"{op}: argument 'topk_idx' values: expected expert ids in "
        f"[-1, {args.num_experts}) on every rank, got ids out of range on rank(s) {{ranks}}"
    )
    duplicates_message = (
        f"{op}: argument 'topk_idx' values: expected distinct experts in each row "
        "(one message per (token, expert)), got a repeated expert on rank(s) {ranks}"
    )
    fields = {
        _TRANSPORT: transport,
        "x's row bytes": h * args.x.element_size(),
        "x's dtype": exchange.dtype_code(args.x.dtype),
        "num_max_dispatch_tokens_per_rank": t_max,
        "num_experts": args.num_experts,
        "topk_idx's K": k,
        "use_fp8": int(args.use_fp8),
        "round_scale": int(args.round_scale),
        "use_ue8m0": int(args.use_ue8m0),
        "slot_weights (given)": int(args.slot_weights is not None),
    }
    gathered = None
    # No header while capturing (a host sync) nor on fake tensors (shape checks): bad ids trip device asserts.
    if not capture.host_readable(args.topk_idx):
        torch._assert_async(~out_of_range.any(), bad_ids_message.format(ranks=[group.rank()]))
        torch._assert_async(~duplicates.to(device), duplicates_message.format(ranks=[group.rank()]))
    else:
        errors = {
            "topk_idx": (bool(out_of_range.any()), bad_ids_message),
            "distinct experts": (bool(duplicates), duplicates_message),
        }
        gathered = exchange.exchange_header(op, group, device, fields, extra, errors, args.timeout_s)
    return group, r, torch.where(out_of_range, -1, idx), gathered


def ll_transport(args, group, r: int, idx: torch.Tensor):
    """The low-latency dispatch's data movement over ``all_to_all`` (after ``ll_dispatch_checks``)."""
    op = meta.LL_DISPATCH
    t_max = args.num_max_dispatch_tokens_per_rank
    device = args.x.device
    t, h = args.x.shape
    k = args.topk_idx.shape[1]
    local = args.num_experts // r
    if args.use_fp8:
        data, scales = _ll_cast(args.x, args.round_scale, args.use_ue8m0)
        parts = [exchange.as_bytes(data), exchange.as_bytes(scales)]
    else:
        parts = [exchange.as_bytes(args.x)]
    widths = [p.shape[1] for p in parts] + [4]
    # Messages: one per (token, slot), placed at [destination rank, local expert, token] (static layout); -1
    # slots go to a spare last row, so no boolean indexing (a host sync) is needed.
    valid = idx >= 0
    slot_t = torch.arange(t, device=device).repeat_interleave(k)
    if args.slot_weights is not None:
        payload = exchange.as_bytes(
            (args.x.unsqueeze(1) * args.slot_weights.to(args.x.dtype).unsqueeze(-1)).reshape(t * k, h)
        )
    else:
        payload = exchange.join(parts).index_select(0, slot_t)
    tag = exchange.as_bytes((slot_t + 1).to(torch.int32).view(-1, 1))
    payload = torch.cat([payload, tag], dim=1)
    width = payload.shape[1]
    spare = r * local * t_max
    send = payload.new_zeros(spare + 1, width)
    # idx = destination * local + local expert
    send[torch.where(valid, idx * t_max + slot_t.view(t, k), spare).reshape(-1)] = payload
    send = send[:spare]
    recv = torch.empty_like(send)
    # ll_dispatch_checks exchanged a header (the regions' guard) unless capturing: then equal splits' table.
    table = _equal_splits(r, local * t_max) if capture.host_readable(args.topk_idx) else None
    exchange.all_to_all_rows(op, group, [(recv, send)], None, None, args.timeout_s, send_rows=table)
    # [source, local expert, token] -> per local expert, sources major, tokens ascending; valid rows first.
    recv = recv.view(r, local, t_max, width).permute(1, 0, 2, 3).reshape(local, r * t_max, width)
    tags = recv[:, :, -4:].contiguous().view(torch.int32).view(local, r * t_max)
    ok = tags > 0
    order = torch.sort((~ok).to(torch.int8), dim=1, stable=True).indices
    packed = recv.gather(1, order.unsqueeze(-1).expand(-1, -1, width))
    ok_sorted = ok.gather(1, order)
    packed = torch.where(ok_sorted.unsqueeze(-1), packed, 0)
    n = r * t_max
    cols = exchange.split(packed.reshape(local * n, width), widths)
    if args.use_fp8:
        recv_x = cols[0].view(torch.float8_e4m3fn).view(local, n, h)
        s_cols, s_dtype = meta.ll_scale_shape(h, True, args.use_ue8m0)
        recv_scales = cols[1].view(s_dtype).view(local, n, s_cols)
    else:
        recv_x = cols[0].view(args.x.dtype).view(local, n, h)
        recv_scales = args.x.new_empty(local, n, 0, dtype=_ABSENT)
    src_info = torch.where(ok_sorted, tags.gather(1, order) - 1, -1).to(torch.int32)
    per_source = ok.view(local, r, t_max).sum(-1).to(torch.int64)  # [L, R]
    begins = torch.cumsum(per_source, dim=1) - per_source
    layout_range = (begins << 32) | per_source
    count = per_source.sum(1).to(torch.int32)
    return recv_x, recv_scales, count, src_info, layout_range, no_backend_state(device)


def ll_row_sources(layout_range: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(source [L, n], inside [L, n])``: the source rank of each row of a low-latency layout, and whether the row
    lies in a source's segment at all. Segments may come in any order (ours are source-major; DeepEP's are in
    arrival order), so a row's source is the segment with the last begin at or before it; no host read."""
    begins, counts = layout_range >> 32, layout_range & 0xFFFFFFFF
    local, r = layout_range.shape
    # An empty segment may share its begin with the next one: order empty ones first among equal begins.
    sorted_keys, order = torch.sort(begins * 2 + (counts > 0), dim=1)
    j = torch.arange(n, device=layout_range.device).expand(local, n).contiguous()
    at = (torch.searchsorted(sorted_keys.contiguous(), j * 2 + 1, right=True) - 1).clamp(min=0)
    source = order.gather(1, at)
    inside = (j >= begins.gather(1, source)) & (j < (begins + counts).gather(1, source))
    return source, inside


def _equal_splits(r: int, rows: int) -> torch.Tensor:
    """The [R, R] split table of the low-latency buffers: every rank sends every rank ``rows`` rows."""
    return torch.full((r, r), rows, dtype=torch.int64)


def no_backend_state(device) -> torch.Tensor:
    """The ``backend_state`` of a transport that keeps none (ours: the handle's tensors say everything): empty
    int32. Our cached dispatch and combine ignore a state handed back."""
    return torch.empty(0, dtype=torch.int32, device=device)


@portable_kernel
def ep_low_latency_dispatch(args):
    group, r, idx, _ = ll_dispatch_checks(args)
    return ll_transport(args, group, r, idx)


def ll_combine_checks(args, extra: torch.Tensor | None = None, errors: dict | None = None, transport: int = OURS):
    """The low-latency combine's checks, the same on every backend: signature and the header every rank exchanges
    (shapes and options agree; ``errors`` raised on every rank if any rank flags one), skipped while capturing.
    Returns ``(group, ranks, the ranks' ``extra`` ints or None)``."""
    op = meta.LL_COMBINE
    r = _checked(op, args, meta.ll_combine_signature)
    group = resolve_group(op, args.group_name)
    local, _, h = args.x.shape
    fields = {
        _TRANSPORT: transport,
        "x's row bytes": h * args.x.element_size(),
        "x's dtype": exchange.dtype_code(args.x.dtype),
        "num_max_dispatch_tokens_per_rank": args.num_max_dispatch_tokens_per_rank,
        "local experts": local,
    }
    gathered = None
    if not capture.capturing(args.x.device):
        gathered = exchange.exchange_header(op, group, args.x.device, fields, extra, errors or {}, args.timeout_s)
    return group, r, gathered


@portable_kernel
def ep_low_latency_combine(args):
    group, r, _ = ll_combine_checks(args)
    return ll_combine_transport(args, group, r)


def ll_combine_transport(args, group, r: int):
    """The low-latency combine's data movement over ``all_to_all`` and its slot-order FP32 sum (after
    ``ll_combine_checks``)."""
    op = meta.LL_COMBINE
    t_max = args.num_max_dispatch_tokens_per_rank
    device = args.x.device
    local, n, h = args.x.shape
    # Each valid row goes back to its source rank, at [source, local expert, token].
    source, inside = ll_row_sources(args.layout_range, n)
    ok = (args.src_info >= 0) & inside
    expert = torch.arange(local, device=device).unsqueeze(1).expand(local, n)
    dest = (source * local + expert) * t_max + args.src_info.long().clamp(min=0)
    spare = r * local * t_max  # rows without a message land in a spare last row: no boolean indexing
    send = args.x.new_zeros(spare + 1, h)
    send[torch.where(ok, dest, spare).reshape(-1)] = args.x.reshape(local * n, h)
    send = send[:spare]
    back = torch.empty_like(send)
    # ll_combine_checks exchanged a header (the regions' guard) unless capturing: then equal splits' table.
    table = None if capture.capturing(device) else _equal_splits(r, local * t_max)
    exchange.all_to_all_rows(op, group, [(back, send)], None, None, args.timeout_s, send_rows=table)
    back = back.view(r * local, t_max, h)  # [global expert, token, H] for this rank's tokens
    acc_t = torch.float64 if args.x.dtype == torch.float64 else torch.float32
    t = args.topk_idx.shape[0]
    idx = args.topk_idx.long()
    out = torch.zeros(t, h, dtype=acc_t, device=device)
    tokens = torch.arange(t, device=device)
    for kk in range(idx.shape[1]):  # slot order, FP32 accumulation
        e = idx[:, kk]
        valid = (e >= 0).unsqueeze(1)
        rows = back[e.clamp(min=0), tokens].to(acc_t)
        out += torch.where(valid, args.topk_weights[:, kk : kk + 1].to(acc_t) * rows, 0)
    return out.to(args.x.dtype)
