"""Low-latency mode (DeepEP's decode path): dispatch into static ``[local expert, R * T_max]`` buffers (optionally
cast to FP8 per 128 channels on the way) and combine back with a slot-order FP32 sum; no host sync, equal splits.
The checks (``ll_dispatch_checks`` / ``ll_combine_checks``) and the data movement (``ll_transport`` /
``ll_combine_transport``) are separate, so other transports (DeepEP's, MC2 on Ascend) reuse the checks."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe._registry import portable_kernel, result_type
from torch_ascend_moe.backends.portable.ep.header import TRANSPORT_FIELD, Transport, bad_ids, checked_on_every_rank
from torch_ascend_moe.backends.portable.ep.outputs import no_backend_state
from torch_ascend_moe.checks import ep as ep_checks
from torch_ascend_moe.distributed import agreement, capture
from torch_ascend_moe.distributed.groups import resolve_group
from torch_ascend_moe.distributed.payload import as_bytes, join, split
from torch_ascend_moe.distributed.transport import all_to_all_rows
from torch_ascend_moe.quant.encodings import E4M3_AMAX_FLOOR, FP8_MAX


def _ll_cast(x: torch.Tensor, round_scale: bool, use_ue8m0: bool):
    """DeepEP's per-128-channel FP8 cast: (E4M3 [T, H], scales). ``scale = 448 / amax`` (amax floored at 1e-4),
    stored ``scale_inv = amax * (1 / 448)``; ``round_scale`` makes ``scale_inv`` a power of two (rounded up) and
    ``scale = 1 / scale_inv``; ``use_ue8m0`` stores its exponent byte, 4 per int32."""
    t, h = x.shape
    groups = x.float().reshape(t, h // ep_checks.LL_BLOCK, ep_checks.LL_BLOCK)  # any strides
    amax = groups.abs().amax(-1).clamp(min=E4M3_AMAX_FLOOR)
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
        # Four codes per int32 along each row (a row-major byte view; no -1 sizes: none can be inferred at T = 0).
        return data, codes.contiguous().view(torch.int32)
    return data, scale_inv


def ll_dispatch_checks(args, extra: torch.Tensor | None = None, transport: Transport = Transport.OURS):
    """The low-latency dispatch's checks, the same on every backend: signature, ids, and the header every rank
    exchanges (shapes and options agree; a bad id on any rank fails every rank); skipped while capturing (device
    asserts instead). Returns ``(group, ranks, ids with out-of-range ones as -1, the ranks' ``extra`` ints or
    None)``."""
    op = ep_checks.LL_DISPATCH
    t_max = args.num_max_dispatch_tokens_per_rank
    r = checked_on_every_rank(op, args, ep_checks.ll_dispatch_signature)
    group = resolve_group(op, args.group_name)
    device = args.x.device
    t, h = args.x.shape
    k = args.topk_idx.shape[1]
    idx = args.topk_idx.long()
    out_of_range = (idx < -1) | (idx >= args.num_experts)
    sorted_ids = torch.sort(torch.where(idx >= 0, idx, -1 - torch.arange(k, device=device)), dim=1).values
    duplicates = (sorted_ids[:, 1:] == sorted_ids[:, :-1]).any() if k > 1 else torch.zeros((), dtype=torch.bool)
    # Templates: ``{ranks}`` is filled with the ranks that flagged the error.
    bad_ids_message = bad_ids(args.num_experts, op)
    duplicates_message = ck.message(
        op,
        "topk_idx",
        "values",
        "distinct experts in each row (one message per (token, expert))",
        "a repeated expert on rank(s) {ranks}",
    )
    fields = {
        TRANSPORT_FIELD: transport,
        "x's row bytes": h * args.x.element_size(),
        "x's dtype": agreement.dtype_code(args.x.dtype),
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
        gathered = agreement.exchange_header(op, group, device, fields, extra, errors, args.timeout_s)
    return group, r, torch.where(out_of_range, -1, idx), gathered


def ll_transport(args, group, r: int, idx: torch.Tensor):
    """The low-latency dispatch's data movement over ``all_to_all`` (after ``ll_dispatch_checks``)."""
    op = ep_checks.LL_DISPATCH
    t_max = args.num_max_dispatch_tokens_per_rank
    device = args.x.device
    t, h = args.x.shape
    k = args.topk_idx.shape[1]
    local = args.num_experts // r
    if args.use_fp8:
        data, scales = _ll_cast(args.x, args.round_scale, args.use_ue8m0)
        parts = [as_bytes(data), as_bytes(scales)]
    else:
        parts = [as_bytes(args.x)]
    widths = [p.shape[1] for p in parts] + [4]
    # Messages: one per (token, slot), placed at [destination rank, local expert, token] (static layout); -1
    # slots go to a spare last row, so no boolean indexing (a host sync) is needed.
    valid = idx >= 0
    slot_t = torch.arange(t, device=device).repeat_interleave(k)
    if args.slot_weights is not None:
        payload = as_bytes((args.x.unsqueeze(1) * args.slot_weights.to(args.x.dtype).unsqueeze(-1)).reshape(t * k, h))
    else:
        payload = join(parts).index_select(0, slot_t)
    tag = as_bytes((slot_t + 1).to(torch.int32).view(-1, 1))
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
    all_to_all_rows(op, group, [(recv, send)], None, None, args.timeout_s, send_rows=table)
    # [source, local expert, token] -> per local expert, sources major, tokens ascending; valid rows first.
    recv = recv.view(r, local, t_max, width).permute(1, 0, 2, 3).reshape(local, r * t_max, width)
    tags = recv[:, :, -4:].contiguous().view(torch.int32).view(local, r * t_max)
    ok = tags > 0
    order = torch.sort((~ok).to(torch.int8), dim=1, stable=True).indices
    packed = recv.gather(1, order.unsqueeze(-1).expand(-1, -1, width))
    ok_sorted = ok.gather(1, order)
    packed = torch.where(ok_sorted.unsqueeze(-1), packed, 0)
    n = r * t_max
    cols = split(packed.reshape(local * n, width), widths)
    if args.use_fp8:
        recv_x = cols[0].view(torch.float8_e4m3fn).view(local, n, h)
        s_cols, s_dtype = ep_checks.ll_scale_shape(h, True, args.use_ue8m0)
        recv_scales = cols[1].view(s_dtype).view(local, n, s_cols)
    else:
        recv_x = cols[0].view(args.x.dtype).view(local, n, h)
        recv_scales = args.x.new_empty(local, n, 0, dtype=ep_checks.ABSENT)
    src_info = torch.where(ok_sorted, tags.gather(1, order) - 1, -1).to(torch.int32)
    per_source = ok.view(local, r, t_max).sum(-1).to(torch.int64)  # [L, R]
    begins = torch.cumsum(per_source, dim=1) - per_source
    layout_range = (begins << 32) | per_source
    count = per_source.sum(1).to(torch.int32)
    return result_type("ep_low_latency_dispatch")(
        recv_x=recv_x,
        recv_x_scales=recv_scales,
        recv_count=count,
        src_info=src_info,
        layout_range=layout_range,
        backend_state=no_backend_state(device),
    )


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


@portable_kernel
def ep_low_latency_dispatch(args):
    group, r, idx, _ = ll_dispatch_checks(args)
    return ll_transport(args, group, r, idx)


def ll_combine_checks(
    args, extra: torch.Tensor | None = None, errors: dict | None = None, transport: Transport = Transport.OURS
):
    """The low-latency combine's checks, the same on every backend: signature and the header every rank exchanges
    (shapes and options agree; ``errors`` raised on every rank if any rank flags one), skipped while capturing.
    Returns ``(group, ranks, the ranks' ``extra`` ints or None)``."""
    op = ep_checks.LL_COMBINE
    r = checked_on_every_rank(op, args, ep_checks.ll_combine_signature)
    group = resolve_group(op, args.group_name)
    local, _, h = args.x.shape
    fields = {
        TRANSPORT_FIELD: transport,
        "x's row bytes": h * args.x.element_size(),
        "x's dtype": agreement.dtype_code(args.x.dtype),
        "num_max_dispatch_tokens_per_rank": args.num_max_dispatch_tokens_per_rank,
        "local experts": local,
    }
    # The ids the combine weighs its slots by, checked as the dispatch checks them (an id past the experts would
    # index past the returned rows on its rank alone; -2 would pass for -1).
    experts = local * r
    out_of_range = ((args.topk_idx < -1) | (args.topk_idx >= experts)).any()
    bad_ids_message = bad_ids(experts, op)
    gathered = None
    if not capture.capturing(args.x.device):
        errors = {"topk_idx": (bool(out_of_range), bad_ids_message), **(errors or {})}
        gathered = agreement.exchange_header(op, group, args.x.device, fields, extra, errors, args.timeout_s)
    else:
        torch._assert_async(~out_of_range, bad_ids_message.format(ranks=[group.rank()]))
    return group, r, gathered


@portable_kernel
def ep_low_latency_combine(args):
    group, r, _ = ll_combine_checks(args)
    return ll_combine_transport(args, group, r)


def ll_combine_transport(args, group, r: int):
    """The low-latency combine's data movement over ``all_to_all`` and its slot-order FP32 sum (after
    ``ll_combine_checks``)."""
    op = ep_checks.LL_COMBINE
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
    all_to_all_rows(op, group, [(back, send)], None, None, args.timeout_s, send_rows=table)
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
