"""The ep family's kernels: expert-parallel dispatch / combine on ``torch.distributed`` (gloo on CPU, NCCL on
CUDA, HCCL on Ascend), device-generic Python: registered on CPU here, on CUDA / NPU with the portable kernels.

One ``all_to_all_single`` moves all of a row's data at once: each send row is the bytes of the token's
``x`` row, its scales, its ``topk_idx`` / ``topk_weights`` and its index + 1 (0 marks a padding row). Before
moving data, every rank ``all_gather``s a small header (its shapes, dtypes, options, local validation
result and, for a compact dispatch, its send counts), so a mismatch between ranks or a bad argument on one
rank raises the same clear error on every rank instead of a hang. Every collective waits at most
``timeout_s``: a rank that never arrives produces an error on the others.

Receive order (DeepEP V1's): source-rank-major, then ascending source token index, identical on every
backend. Combine adds biases first, then each source rank's copies in ascending rank order, in FP32 (FP64
for FP64 rows), and rounds once.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

from torch_ascend_moe.meta import ep as meta

# An absent optional (no scales, no weights) comes back as an empty int32 [N, 0] placeholder: not a
# floating output, so it never looks differentiable.
_ABSENT = torch.int32


def layout(topk_idx, num_experts, num_ranks, ranks_per_node=8):
    """DeepEP's get_dispatch_layout (specs §3)."""
    meta.layout_signature(topk_idx, num_experts, num_ranks, ranks_per_node)
    idx = topk_idx.long()
    t = idx.shape[0]
    valid = idx >= 0
    per_expert = torch.zeros(num_experts, dtype=torch.int64, device=idx.device)
    per_expert.index_add_(0, idx[valid], torch.ones_like(idx[valid]))
    rank_of = torch.where(valid, idx // (num_experts // num_ranks), -1)
    in_rank = torch.zeros(t, num_ranks, dtype=torch.bool, device=idx.device)
    rows = torch.arange(t, device=idx.device).unsqueeze(1).expand_as(idx)
    in_rank[rows[valid], rank_of[valid]] = True
    nodes = max(1, num_ranks // ranks_per_node)
    if num_ranks % ranks_per_node == 0:
        in_node = in_rank.view(t, nodes, ranks_per_node).any(-1)
    else:  # fewer ranks than one node holds: a single node
        in_node = in_rank.any(1, keepdim=True)
    return (
        in_rank.sum(0).int(),
        in_node.sum(0).int(),
        per_expert.int(),
        in_rank,
    )


# ---- collectives with a deadline ----


def _wait(op: str, group, work, timeout_s: float, what: str) -> None:
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise RuntimeError(
            f"{op}: rank {group.rank()} of {group.size()}: {what} did not complete within {timeout_s:g} s "
            f"(a rank never arrived, or the ranks called different ops): {e}"
        ) from e


def _all_to_all(op, group, out, inp, out_splits, in_splits, timeout_s) -> None:
    work = dist.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=True)
    _wait(op, group, work, timeout_s, "the all-to-all")


def _all_reduce_max(op, group, t, timeout_s) -> None:
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
    _wait(op, group, work, timeout_s, "the all-reduce")


def _exchange_header(op: str, group, device, fields: dict, extra: torch.Tensor | None, errors: dict, timeout_s):
    """all_gather every rank's ``fields`` (ints that must agree), ``errors`` (name -> (failed here, message with
    a ``{ranks}`` placeholder)) and ``extra`` (per-rank ints); raise the same error on every rank on any
    disagreement or failure."""
    names = list(fields)
    local = [int(fields[n]) for n in names] + [int(errors[n][0]) for n in errors]
    row = torch.tensor(local, dtype=torch.int64)
    if extra is not None:
        row = torch.cat([row, extra.to("cpu", torch.int64)])
    row = row.to(device)
    gathered = [torch.empty_like(row) for _ in range(group.size())]
    if row.numel() and gathered:
        # Ranks disagreeing on the header length would stall all_gather: pad the length into a fixed first step.
        size = torch.tensor([row.numel()], dtype=torch.int64, device=device)
        sizes = [torch.empty_like(size) for _ in range(group.size())]
        _wait(op, group, dist.all_gather(sizes, size, group=group, async_op=True), timeout_s, "the header exchange")
        lengths = [int(s) for s in sizes]
        if len(set(lengths)) > 1:
            raise ValueError(
                f"{op}: the ranks disagree on the call (header lengths {lengths}: different shapes or options per rank)"
            )
        _wait(op, group, dist.all_gather(gathered, row, group=group, async_op=True), timeout_s, "the header exchange")
    table = torch.stack(gathered).cpu() if gathered else row.view(1, -1).cpu()
    for j, name in enumerate(names):
        column = table[:, j].tolist()
        if len(set(column)) > 1:
            raise ValueError(
                f"{op}: the ranks disagree on {name}: {column} (rank i's value at position i); "
                "every rank must pass the same shapes and options"
            )
    for j, name in enumerate(errors):
        flags = table[:, len(names) + j].tolist()
        bad = [i for i, f in enumerate(flags) if f]
        if bad:
            raise ValueError(errors[name][1].format(ranks=bad))
    return table[:, len(names) + len(errors) :]


def _capturing(device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


# ---- row payloads ----


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """``[rows, ...]`` as ``[rows, bytes per row]`` uint8."""
    width = t.element_size()
    for d in t.shape[1:]:
        width *= d
    if t.numel() == 0:  # empty tensors count as contiguous whatever their strides, and may not be viewable
        return torch.empty(t.shape[0], width, dtype=torch.uint8, device=t.device)
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], width)


def _wide(rows: torch.Tensor) -> torch.Tensor:
    """Byte rows seen as int64 words when their width allows: gathers move 8x fewer elements."""
    return rows.view(torch.int64) if rows.shape[1] % 8 == 0 and rows.is_contiguous() else rows


def _take(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """rows[index] with -1 entries giving zero rows."""
    if not rows.shape[0]:
        return rows.new_zeros(index.shape[0], rows.shape[1])
    wide = _wide(rows)
    if bool((index >= 0).all()):
        return wide.index_select(0, index).view(torch.uint8)
    taken = wide.index_select(0, index.clamp(min=0))
    return torch.where((index >= 0).unsqueeze(1), taken, 0).view(torch.uint8)


def _pad8(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Payload parts padded with zero bytes to a multiple of 8 bytes per row."""
    width = sum(p.shape[1] for p in parts)
    pad = (-width) % 8
    return parts + [parts[0].new_zeros(parts[0].shape[0], pad)] if pad else parts


def _split(payload: torch.Tensor, widths: list[int]) -> list[torch.Tensor]:
    if widths and widths[0] == payload.shape[1]:
        return [payload]  # one part: no copy
    out, start = [], 0
    for w in widths:
        out.append(payload[:, start : start + w].clone(memory_format=torch.contiguous_format))
        start += w
    return out


_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.int32, torch.int64)


def _dtype_code(dtype) -> int:
    """A rank-independent number for a dtype (the header carries ints)."""
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def ep_dispatch(
    x,
    x_scales,
    topk_idx,
    topk_weights,
    num_experts,
    group_name,
    expert_alignment=1,
    num_worst_tokens=0,
    timeout_s=300.0,
):
    op = meta.DISPATCH
    r = meta.dispatch_signature(
        x, x_scales, topk_idx, topk_weights, num_experts, group_name, expert_alignment, num_worst_tokens, timeout_s
    )
    group = meta.resolve_group(op, group_name)
    rank, device = group.rank(), x.device
    t, h = x.shape
    k = topk_idx.shape[1]
    local_experts = num_experts // r
    idx = topk_idx.long()
    out_of_range = (idx < -1) | (idx >= num_experts)
    bad_ids = bool(out_of_range.any())
    idx = torch.where(out_of_range, -1, idx)  # the header exchange must still happen, so every rank can raise
    _, _, _, in_rank = layout(idx, num_experts, r)
    static = num_worst_tokens > 0
    errors = {
        "topk_idx": (
            bad_ids,
            f"{op}: argument 'topk_idx' values: expected expert ids in [-1, {num_experts}) on every "
            "rank, got ids out of range on rank(s) {ranks}",
        ),
    }
    fields = {
        "x's row bytes": x.shape[1] * x.element_size(),
        "x's dtype": _dtype_code(x.dtype),
        "x_scales' columns": -1 if x_scales is None else x_scales.shape[1],
        "x_scales' dtype": -1 if x_scales is None else _dtype_code(x_scales.dtype),
        "topk_idx's K": k,
        "num_experts": num_experts,
        "topk_weights (given, dtype)": -1 if topk_weights is None else _dtype_code(topk_weights.dtype),
        "num_worst_tokens": num_worst_tokens,
        "expert_alignment": expert_alignment,
    }
    if static:
        fields["T (a static dispatch needs the same token count on every rank)"] = t
    counts = in_rank.sum(0).long()
    if not _capturing(device):
        table = _exchange_header(op, group, device, fields, None if static else counts, errors, timeout_s)
    elif bad_ids:
        raise ValueError(errors["topk_idx"][1].format(ranks=[rank]))
    if static:
        send_src = torch.where(in_rank.t(), torch.arange(t, device=device), -1).reshape(-1)
        send_counts = torch.full((r,), t, dtype=torch.int64, device=device)
        recv_counts = send_counts.clone()
        in_splits = out_splits = None
    else:
        pairs = in_rank.t().nonzero()  # (destination, token), destination-major then ascending token
        send_src = pairs[:, 1].clone(memory_format=torch.contiguous_format)
        send_counts = counts
        recv_counts = table[:, rank].to(device).clone(memory_format=torch.contiguous_format)
        in_splits, out_splits = send_counts.tolist(), recv_counts.tolist()
    # One payload row per token: x | scales | topk_idx | topk_weights | token index + 1.
    parts = [_bytes(x)]
    if x_scales is not None:
        parts.append(_bytes(x_scales))
    parts.append(_bytes(idx))
    if topk_weights is not None:
        parts.append(_bytes(topk_weights))
    parts = _pad8(parts)  # the 8-byte tag keeps the width a multiple of 8
    parts.append(_bytes(torch.arange(1, t + 1, device=device).view(t, 1)))
    widths = [p.shape[1] for p in parts]
    payload = torch.cat(parts, dim=1)
    send_buf = _take(payload, send_src)
    recv_rows = int(sum(out_splits)) if out_splits is not None else r * t
    recv_buf = payload.new_empty(recv_rows, payload.shape[1])
    _all_to_all(op, group, recv_buf, send_buf, out_splits, in_splits, timeout_s)
    tag = _split(recv_buf, widths)[-1].view(torch.int64).view(-1)
    valid = tag > 0
    n_valid = valid.sum().view(1)
    if static:
        if not _capturing(device):
            overflow = (n_valid > num_worst_tokens).to(torch.int64)
            _all_reduce_max(op, group, overflow, timeout_s)
            if bool(overflow):
                raise ValueError(
                    f"{op}: argument 'num_worst_tokens' value: expected at least the rows every rank receives, "
                    f"got {num_worst_tokens} (rank {rank} receives {int(n_valid)}; rows are never dropped)"
                )
        order = torch.sort((~valid).to(torch.int8), stable=True).indices
        width = min(num_worst_tokens, recv_rows)
        pos = torch.arange(num_worst_tokens, device=device)
        recv_gather = torch.full((num_worst_tokens,), -1, dtype=torch.int64, device=device)
        recv_gather[:width] = torch.where(pos[:width] < n_valid, order[:width], -1)
    else:
        recv_gather = torch.arange(recv_rows, device=device)
    rows = _split(recv_buf if not static else _take(recv_buf, recv_gather), widths)
    n = recv_gather.shape[0]
    recv_x = rows[0].view(x.dtype).view(n, h)
    i = 1
    if x_scales is not None:
        recv_scales = rows[i].view(x_scales.dtype).view(n, x_scales.shape[1])
        i += 1
    else:
        recv_scales = x.new_empty(n, 0, dtype=_ABSENT)
    src_idx = rows[i].view(torch.int64).view(n, k)
    i += 1
    row_valid = (recv_gather >= 0).unsqueeze(1)
    local = src_idx - rank * local_experts
    mine = row_valid & (src_idx >= 0) & (local >= 0) & (local < local_experts)
    recv_topk_idx = torch.where(mine, local, -1)
    if topk_weights is not None:
        recv_w = rows[i].view(topk_weights.dtype).view(n, k)
        recv_topk_weights = torch.where(mine, recv_w, 0)
    else:
        recv_topk_weights = x.new_empty(n, 0, dtype=_ABSENT)
    per_expert = torch.zeros(local_experts, dtype=torch.int64, device=device)
    per_expert.index_add_(0, recv_topk_idx[mine], torch.ones_like(recv_topk_idx[mine]))
    per_expert = (per_expert + expert_alignment - 1) // expert_alignment * expert_alignment
    return (
        recv_x,
        recv_scales,
        recv_topk_idx,
        recv_topk_weights,
        per_expert.int(),
        n_valid.to(torch.int64),
        send_src,
        send_counts,
        recv_counts,
        recv_gather,
    )


def _check_counts(op, group, device, send_counts, recv_counts, fields, timeout_s) -> tuple[list[int], list[int]]:
    """Every rank's counts must pair up (rank s sends rank d what d expects from s)."""
    table = _exchange_header(op, group, device, fields, torch.cat([send_counts, recv_counts]).cpu(), {}, timeout_s)
    r, rank = group.size(), group.rank()
    sends = table[:, :r]  # sends[s, d]
    recvs = table[:, r:]  # recvs[d, s]
    if not torch.equal(sends, recvs.t()):
        raise ValueError(
            f"{op}: the handles do not pair up across ranks (rank s's send_counts[d] must equal rank d's "
            f"recv_counts[s]); rank {rank} has send_counts {send_counts.tolist()}, recv_counts "
            f"{recv_counts.tolist()}: pass every rank the handle of the same dispatch"
        )
    return send_counts.tolist(), recv_counts.tolist()


def ep_dispatch_cached(x, x_scales, send_src, send_counts, recv_counts, recv_gather, group_name, timeout_s=300.0):
    op = meta.CACHED
    meta.cached_signature(x, x_scales, send_src, send_counts, recv_counts, recv_gather, group_name, timeout_s)
    group = meta.resolve_group(op, group_name)
    device = x.device
    fields = {
        "x's row bytes": x.shape[1] * x.element_size(),
        "x's dtype": _dtype_code(x.dtype),
        "x_scales' columns": -1 if x_scales is None else x_scales.shape[1],
    }
    in_splits, out_splits = _check_counts(op, group, device, send_counts, recv_counts, fields, timeout_s)
    parts = _pad8([_bytes(x)] + ([_bytes(x_scales)] if x_scales is not None else []))
    widths = [p.shape[1] for p in parts]
    payload = torch.cat(parts, dim=1)
    send_buf = _take(payload, send_src)
    recv_buf = payload.new_empty(sum(out_splits), payload.shape[1])
    _all_to_all(op, group, recv_buf, send_buf, out_splits, in_splits, timeout_s)
    rows = _split(_take(recv_buf, recv_gather), widths)
    n = recv_gather.shape[0]
    recv_x = rows[0].view(x.dtype).view(n, x.shape[1])
    if x_scales is not None:
        recv_scales = rows[1].view(x_scales.dtype).view(n, x_scales.shape[1])
    else:
        recv_scales = x.new_empty(n, 0, dtype=_ABSENT)
    return recv_x, recv_scales


def ep_combine(
    x,
    topk_weights,
    bias_0,
    bias_1,
    send_src,
    send_counts,
    recv_counts,
    recv_gather,
    num_tokens,
    group_name,
    timeout_s=300.0,
):
    op = meta.COMBINE
    meta.combine_signature(
        x,
        topk_weights,
        bias_0,
        bias_1,
        send_src,
        send_counts,
        recv_counts,
        recv_gather,
        num_tokens,
        group_name,
        timeout_s,
    )
    group = meta.resolve_group(op, group_name)
    device = x.device
    fields = {
        "x's row bytes": x.shape[1] * x.element_size(),
        "x's dtype": _dtype_code(x.dtype),
        "topk_weights (K, dtype)": -1
        if topk_weights is None
        else topk_weights.shape[1] * 1000 + topk_weights.element_size(),
    }
    # The reverse route: what this rank received it now sends back.
    in_splits, out_splits = _check_counts(op, group, device, recv_counts, send_counts, fields, timeout_s)
    parts = _pad8([_bytes(x)] + ([_bytes(topk_weights)] if topk_weights is not None else []))
    widths = [p.shape[1] for p in parts]
    payload = torch.cat(parts, dim=1)
    rows_back = sum(in_splits)
    if recv_gather.shape[0] == rows_back and torch.equal(recv_gather, torch.arange(rows_back, device=device)):
        send_buf = payload  # compact handle: rows are already in receive-buffer order
    else:
        valid = recv_gather >= 0
        send_buf = payload.new_zeros(rows_back, payload.shape[1])
        _wide(send_buf).index_copy_(0, recv_gather[valid], _wide(payload)[valid])
    back = payload.new_empty(sum(out_splits), payload.shape[1])
    _all_to_all(op, group, back, send_buf, out_splits, in_splits, timeout_s)
    rows = _split(back, widths)
    acc_t = torch.float64 if x.dtype == torch.float64 else torch.float32
    h = x.shape[1]
    out = torch.zeros(num_tokens, h, dtype=acc_t, device=device)
    for b in (bias_0, bias_1):
        if b is not None:
            out += b.to(acc_t)
    returned = rows[0].view(x.dtype).view(-1, h)
    k = topk_weights.shape[1] if topk_weights is not None else 0
    w_t = topk_weights.dtype if topk_weights is not None else _ABSENT
    out_w = torch.zeros(num_tokens, k, dtype=w_t, device=device)
    returned_w = rows[1].view(w_t).view(-1, k) if topk_weights is not None else None
    start = 0
    for count in out_splits:  # source ranks ascending; one copy per token per rank, so index_add is exact
        seg = slice(start, start + count)
        src = send_src[seg]
        if bool((src >= 0).all()):  # compact handles: no padding rows to skip
            out.index_add_(0, src, returned[seg].to(acc_t))
            if returned_w is not None:
                out_w.index_add_(0, src, returned_w[seg])
        else:
            ok = src >= 0
            out.index_add_(0, src[ok], returned[seg][ok].to(acc_t))
            if returned_w is not None:
                out_w.index_add_(0, src[ok], returned_w[seg][ok])
        start += count
    return out.to(x.dtype), out_w


# ---- low-latency mode ----


def _ll_cast(x: torch.Tensor, round_scale: bool, use_ue8m0: bool):
    """DeepEP's per-128-channel FP8 cast: (E4M3 [T, H], scales). ``scale = 448 / amax`` (amax floored at 1e-4),
    stored ``scale_inv = amax / 448``; ``round_scale`` makes ``scale_inv`` a power of two (rounded up) and
    ``scale = 1 / scale_inv``; ``use_ue8m0`` stores its exponent byte, 4 per int32."""
    t, h = x.shape
    groups = x.float().view(t, h // meta.LL_BLOCK, meta.LL_BLOCK)
    amax = groups.abs().amax(-1).clamp(min=1e-4)
    if round_scale:
        scale_inv = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
        scale = 1.0 / scale_inv
    else:
        scale, scale_inv = 448.0 / amax, amax / 448.0
    data = (groups * scale.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(t, h)
    if use_ue8m0:
        codes = ((scale_inv.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
        return data, codes.view(t, -1, 4).contiguous().view(torch.int32).view(t, -1)
    return data, scale_inv


def ep_low_latency_dispatch(
    x,
    topk_idx,
    num_max_dispatch_tokens_per_rank,
    num_experts,
    group_name,
    use_fp8=True,
    round_scale=False,
    use_ue8m0=False,
    slot_weights=None,
    timeout_s=300.0,
):
    op = meta.LL_DISPATCH
    t_max = num_max_dispatch_tokens_per_rank
    r = meta.ll_dispatch_signature(
        x, topk_idx, t_max, num_experts, group_name, use_fp8, round_scale, use_ue8m0, slot_weights, timeout_s
    )
    group = meta.resolve_group(op, group_name)
    device = x.device
    t, h = x.shape
    k = topk_idx.shape[1]
    local = num_experts // r
    idx = topk_idx.long()
    out_of_range = (idx < -1) | (idx >= num_experts)
    sorted_ids = torch.sort(torch.where(idx >= 0, idx, -1 - torch.arange(k, device=device)), dim=1).values
    duplicates = bool((sorted_ids[:, 1:] == sorted_ids[:, :-1]).any()) if k > 1 else False
    errors = {
        "topk_idx": (
            bool(out_of_range.any()),
            f"{op}: argument 'topk_idx' values: expected expert ids in "
            f"[-1, {num_experts}) on every rank, got ids out of range on rank(s) {{ranks}}",
        ),
        "distinct experts": (
            duplicates,
            f"{op}: argument 'topk_idx' values: expected distinct experts in each row "
            "(one message per (token, expert)), got a repeated expert on rank(s) {ranks}",
        ),
    }
    fields = {
        "x's row bytes": h * x.element_size(),
        "x's dtype": _dtype_code(x.dtype),
        "num_max_dispatch_tokens_per_rank": t_max,
        "num_experts": num_experts,
        "topk_idx's K": k,
        "use_fp8": int(use_fp8),
        "round_scale": int(round_scale),
        "use_ue8m0": int(use_ue8m0),
        "slot_weights (given)": int(slot_weights is not None),
    }
    if not _capturing(device):
        _exchange_header(op, group, device, fields, None, errors, timeout_s)
    idx = torch.where(out_of_range, -1, idx)
    if use_fp8:
        data, scales = _ll_cast(x, round_scale, use_ue8m0)
        parts = [_bytes(data), _bytes(scales)]
    else:
        parts = [_bytes(x)]
    widths = [p.shape[1] for p in parts] + [4]
    # Messages: one per valid (token, slot), placed at [destination rank, local expert, token] (static layout).
    valid = idx >= 0
    tok = torch.arange(t, device=device).unsqueeze(1).expand(t, k)
    slot_t, slot_e = tok[valid], idx[valid]
    if slot_weights is not None:
        rows = (x.unsqueeze(1) * slot_weights.to(x.dtype).unsqueeze(-1))[valid]  # [messages, H]
        payload = _bytes(rows)
    else:
        payload = torch.cat(parts, dim=1)[slot_t]
    tag = _bytes((slot_t + 1).to(torch.int32).view(-1, 1))
    payload = torch.cat([payload, tag], dim=1)
    width = payload.shape[1]
    send = payload.new_zeros(r * local * t_max, width)
    send[slot_e * t_max + slot_t] = payload  # slot_e = destination * local + local expert
    recv = torch.empty_like(send)
    _all_to_all(op, group, recv, send, None, None, timeout_s)
    # [source, local expert, token] -> per local expert, sources major, tokens ascending; valid rows first.
    recv = recv.view(r, local, t_max, width).permute(1, 0, 2, 3).reshape(local, r * t_max, width)
    tags = recv[:, :, -4:].contiguous().view(torch.int32).view(local, r * t_max)
    ok = tags > 0
    order = torch.sort((~ok).to(torch.int8), dim=1, stable=True).indices
    packed = recv.gather(1, order.unsqueeze(-1).expand(-1, -1, width))
    ok_sorted = ok.gather(1, order)
    packed = torch.where(ok_sorted.unsqueeze(-1), packed, 0)
    n = r * t_max
    cols = _split(packed.reshape(local * n, width), widths)
    if use_fp8:
        recv_x = cols[0].view(torch.float8_e4m3fn).view(local, n, h)
        s_cols, s_dtype = meta.ll_scale_shape(h, True, use_ue8m0)
        recv_scales = cols[1].view(s_dtype).view(local, n, s_cols)
    else:
        recv_x = cols[0].view(x.dtype).view(local, n, h)
        recv_scales = x.new_empty(local, n, 0, dtype=_ABSENT)
    src_info = torch.where(ok_sorted, tags.gather(1, order) - 1, -1).to(torch.int32)
    per_source = ok.view(local, r, t_max).sum(-1).to(torch.int64)  # [L, R]
    begins = torch.cumsum(per_source, dim=1) - per_source
    layout_range = (begins << 32) | per_source
    return recv_x, recv_scales, per_source.sum(1).to(torch.int32), src_info, layout_range


def ep_low_latency_combine(
    x, topk_idx, topk_weights, src_info, layout_range, num_max_dispatch_tokens_per_rank, group_name, timeout_s=300.0
):
    op = meta.LL_COMBINE
    t_max = num_max_dispatch_tokens_per_rank
    r = meta.ll_combine_signature(x, topk_idx, topk_weights, src_info, layout_range, t_max, group_name, timeout_s)
    group = meta.resolve_group(op, group_name)
    device = x.device
    local, n, h = x.shape
    fields = {
        "x's row bytes": h * x.element_size(),
        "x's dtype": _dtype_code(x.dtype),
        "num_max_dispatch_tokens_per_rank": t_max,
        "local experts": local,
    }
    if not _capturing(device):
        _exchange_header(op, group, device, fields, None, {}, timeout_s)
    # Each valid row goes back to its source rank, at [source, local expert, token].
    counts = layout_range & 0xFFFFFFFF
    ends = torch.cumsum(counts, dim=1)  # [L, R] inclusive
    j = torch.arange(n, device=device).expand(local, n)
    source = torch.searchsorted(ends.contiguous(), j.contiguous(), right=True)  # [L, n]
    ok = src_info >= 0
    expert = torch.arange(local, device=device).unsqueeze(1).expand(local, n)
    dest = (source * local + expert) * t_max + src_info.long().clamp(min=0)
    send = x.new_zeros(r * local * t_max, h)
    send[dest[ok]] = x[ok]
    back = torch.empty_like(send)
    _all_to_all(op, group, back, send, None, None, timeout_s)
    back = back.view(r * local, t_max, h)  # [global expert, token, H] for this rank's tokens
    acc_t = torch.float64 if x.dtype == torch.float64 else torch.float32
    t = topk_idx.shape[0]
    idx = topk_idx.long()
    out = torch.zeros(t, h, dtype=acc_t, device=device)
    tokens = torch.arange(t, device=device)
    for kk in range(idx.shape[1]):  # slot order, FP32 accumulation
        e = idx[:, kk]
        valid = (e >= 0).unsqueeze(1)
        rows = back[e.clamp(min=0), tokens].to(acc_t)
        out += torch.where(valid, topk_weights[:, kk : kk + 1].to(acc_t) * rows, 0)
    return out.to(x.dtype)


KERNELS = {
    "ep_dispatch_layout": layout,
    "ep_dispatch": ep_dispatch,
    "ep_dispatch_cached": ep_dispatch_cached,
    "ep_combine": ep_combine,
    "ep_low_latency_dispatch": ep_low_latency_dispatch,
    "ep_low_latency_combine": ep_low_latency_combine,
}
# The same Python kernels serve the CPU (gloo); CUDA and NPU register them with the other portable kernels.
_lib = torch.library.Library("ascend_moe", "IMPL")
for _name, _fn in KERNELS.items():
    _lib.impl(_name, _fn, "CPU")
