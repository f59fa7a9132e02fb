"""Stage 2, dispatch (DeepEP's normal mode): each token's row to every rank owning one of its experts, once per
rank, with a narrow metadata row (scales, ids, weights, its index) beside it; and the cached dispatch, which
replays a dispatch's handle with new rows. Send side (``_send_plan``) and receive side (``_unpack``) each have a
CPU helper kernel and a tensor-op twin, bitwise equal."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe._registry import portable_kernel, result_type
from torch_ascend_moe.backends.portable.ep.header import (
    Transport,
    bad_ids,
    cached_fields,
    checked_on_every_rank,
    dispatch_fields,
    static_overflow,
)
from torch_ascend_moe.backends.portable.ep.layout import layout_of, per_local_expert
from torch_ascend_moe.backends.portable.ep.outputs import absent, no_backend_state
from torch_ascend_moe.backends.portable.ep.route import cached_row_errors, checked_route
from torch_ascend_moe.checks import ep as ep_checks
from torch_ascend_moe.distributed import agreement, capture, payload, transport
from torch_ascend_moe.distributed.groups import resolve_group


@portable_kernel
def ep_dispatch(args):
    op = ep_checks.DISPATCH
    r = checked_on_every_rank(op, args, ep_checks.dispatch_signature)
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
    bad_ids_message = bad_ids(args.num_experts)
    fields = dispatch_fields(args, Transport.OURS)
    if capturing and not static:
        raise ValueError(
            ck.message(
                op,
                "num_worst_tokens",
                "value",
                "a positive static row count while a CUDA graph is captured (a compact dispatch's row count is "
                "data-dependent, read on the host)",
                0,
            )
        )
    if capturing:
        # No header while a graph is captured (reading it is a host sync): bad ids trip a device-side assert.
        torch._assert_async(bad == 0, bad_ids_message.format(ranks=[rank]))
    else:
        errors = {"topk_idx": (bool(bad), bad_ids_message)}
        # A static dispatch sends every rank T slots, so its header carries T (ranks may differ, as DeepEP's).
        sent = torch.full((r,), t, dtype=torch.int64) if static else counts
        table = agreement.exchange_header(op, group, device, fields, sent, errors, args.timeout_s)
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
    recv_x = payload.new_rows(args.x, recv_rows, h)
    recv_meta = meta_rows.new_empty(recv_rows, meta_rows.shape[1])
    transport.all_to_all_rows(
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
                static_overflow(op, args.num_worst_tokens, rank, "more"),
            )
        else:
            overflow = (n_valid > args.num_worst_tokens).to(torch.int64)
            transport.all_reduce_max(op, group, overflow, args.timeout_s)
            if bool(overflow):
                raise ValueError(static_overflow(op, args.num_worst_tokens, rank, int(n_valid)))
        order = torch.sort((~valid).to(torch.int8), stable=True).indices
        width = min(args.num_worst_tokens, recv_rows)
        pos = torch.arange(args.num_worst_tokens, device=device)
        recv_gather = torch.full((args.num_worst_tokens,), -1, dtype=torch.int64, device=device)
        recv_gather[:width] = torch.where(pos[:width] < n_valid, order[:width], -1)
        recv_x = payload.take_rows(recv_x, recv_gather, True)
        recv_meta = payload.take_rows(recv_meta, recv_gather, True)
    else:
        recv_gather = torch.arange(recv_rows, device=device)
        n_valid = torch.full((1,), recv_rows, dtype=torch.int64, device=device)  # every compact row is valid
    n = recv_gather.shape[0]
    scales, recv_topk_idx, weights, per_expert, src = _unpack(
        recv_meta,
        payload.row_bytes(args.x_scales) if args.x_scales is not None else 0,
        k,
        args.topk_weights.element_size() if args.topk_weights is not None else 0,
        rank * local_experts,
        local_experts,
        args.expert_alignment,
    )
    return result_type("ep_dispatch")(
        recv_x=recv_x,
        # A fresh placeholder for each absent output: a custom op's outputs may not alias one another.
        recv_x_scales=absent(args.x, n)
        if args.x_scales is None
        else scales.view(args.x_scales.dtype).view(n, args.x_scales.shape[1]),
        recv_topk_idx=recv_topk_idx,
        recv_topk_weights=absent(args.x, n)
        if args.topk_weights is None
        else weights.view(args.topk_weights.dtype).view(n, k),
        num_recv_tokens_per_expert=per_expert,
        num_recv=n_valid,
        send_src=send_src,
        send_counts=send_counts,
        recv_counts=recv_counts,
        recv_gather=recv_gather,
        recv_src_idx=src,
        backend_state=no_backend_state(device),
    )


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
    ep_checks.dispatch_plan_signature(topk_idx, num_experts, r, x_scales, topk_weights)
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
    parts = [] if x_scales is None else [payload.as_bytes(x_scales)]
    parts.append(payload.as_bytes(ids))
    if topk_weights is not None:
        parts.append(payload.as_bytes(topk_weights))
    parts = payload.pad8(parts)  # the 8-byte tag keeps the width a multiple of 8
    parts.append(payload.as_bytes(torch.arange(1, t + 1, device=device).view(t, 1)))
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
    ep_checks.dispatch_unpack_signature(meta, scale_bytes, k, weight_size, local_experts, alignment)
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


@portable_kernel
def ep_dispatch_cached(args):
    op = ep_checks.CACHED
    _, group, route = checked_route(
        op,
        ep_checks.cached_signature,
        cached_fields,
        args,
        Transport.OURS,
        lambda: cached_row_errors(op, args.x, args.send_src),
    )
    n = args.recv_gather.shape[0]
    pairs = [(args.x, args.x.new_empty(route.rows_out, args.x.shape[1]))]
    if args.x_scales is not None:
        pairs.append((args.x_scales, args.x_scales.new_empty(route.rows_out, args.x_scales.shape[1])))
    transport.all_to_all_rows(
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
    received = [out if route.compact_recv else payload.take_rows(out, args.recv_gather, True) for _, out in pairs]
    recv_scales = received[1] if args.x_scales is not None else absent(args.x, n)
    return received[0], recv_scales
