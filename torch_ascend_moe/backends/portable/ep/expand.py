"""Stage 3 (optional), expand: DeepEP V2's ``do_expand`` layout of received rows, one row per (row, local expert)
slot, expert-major, each expert's block aligned: what a grouped GEMM reads."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe._registry import portable_kernel, result_type
from torch_ascend_moe.checks import ep as ep_checks
from torch_ascend_moe.checks.ep import ABSENT
from torch_ascend_moe.distributed import capture, payload


@portable_kernel
def ep_expand(args):
    """One row per (row, local expert) slot, expert-major, each block aligned; no host sync when ``num_rows``
    is given (the static capacity) and no boolean indexing: scatters land -1 slots in a spare row."""
    op = ep_checks.EXPAND
    ep_checks.expand_signature(args)
    device = args.x.device
    n, k = args.topk_idx.shape
    local, align = args.num_local_experts, args.expert_alignment
    idx = args.topk_idx.long()
    if not capture.capturing(device):
        bad = (idx < -1) | (idx >= local)
        if bool(bad.any()):
            raise ValueError(
                ck.message(op, "topk_idx", "values", f"local expert ids in [-1, {local})", int(idx[bad][0]))
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
            expected = f"at least the layout's {int(aligned.sum())} rows (each expert's count aligned up to {align})"
            raise ValueError(ck.message(op, "num_rows", "value", expected, m))
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
    expanded_x = payload.take_rows(args.x, src, padded)
    if args.x_scales is not None:
        expanded_scales = payload.take_rows(args.x_scales, src, padded)
    else:
        expanded_scales = args.x.new_empty(m, 0, dtype=ABSENT)
    if args.topk_weights is not None:
        w = args.topk_weights.reshape(-1)
        expanded_w = torch.where(slot_of >= 0, w[slot_of.clamp(min=0)] if w.numel() else w.new_zeros(m), 0)
    else:
        expanded_w = args.x.new_empty(0, dtype=ABSENT)
    return result_type("ep_expand")(
        expanded_x=expanded_x,
        expanded_x_scales=expanded_scales,
        expanded_weights=expanded_w,
        expand_rows=expand_rows,
        psum=(starts + counts).int(),
        counts=counts.int(),
    )
