"""Stage 4, combine: every token's copies back from the ranks that received them, summed with up to two biases in
FP32 (FP64 for FP64 rows) and rounded once; copies add in ascending source rank, or in a given copy order."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.backends.portable.ep.header import Transport, combine_fields
from torch_ascend_moe.backends.portable.ep.route import checked_route
from torch_ascend_moe.checks import ep as ep_checks
from torch_ascend_moe.checks.ep import ABSENT
from torch_ascend_moe.distributed import capture, payload, transport


@portable_kernel
def ep_combine(args):
    op = ep_checks.COMBINE
    # The reverse route: what this rank received it now sends back.
    _, group, route = checked_route(op, ep_checks.combine_signature, combine_fields, args, Transport.OURS)
    device = args.x.device
    # Rows go back in the dispatch's receive-buffer order: a compact handle's rows already are (no copy).
    sends = [args.x] if args.topk_weights is None else [args.x, args.topk_weights]
    if not route.compact_recv:
        sends = [payload.place_rows(rows, args.recv_gather, route.rows_out) for rows in sends]
    received = transport.received_blocks(
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
        return out, args.x.new_empty(args.num_tokens, 0, dtype=ABSENT)
    return out, _reduce_rows(received[1], dest, args.num_tokens, None, None, group.size(), visit)


def _reduce_rows(blocks, dest, num_tokens, bias_0, bias_1, passes, visit=None):
    """``out[t] = round(0 + bias_0[t] + bias_1[t] + rows[i] + ...)`` over the rows ``i`` with ``dest[i] == t``
    in ascending ``i`` (= ascending source rank), or in the order of the permutation ``visit``, accumulated in
    FP32 (FP64 for FP64 rows); at most ``passes`` rows per token. ``rows`` is the concatenation of ``blocks``."""
    if capture.host_kernels(blocks[0].device):
        out = payload.new_rows(blocks[0], num_tokens, *blocks[0].shape[1:])  # 256 KiB or more: reused pages
        return torch.ops.ascend_moe_kernels.ep_combine_reduce.out(
            blocks, dest, num_tokens, bias_0, bias_1, visit, out=out
        )
    ep_checks.combine_reduce_signature(blocks, dest, num_tokens, bias_0, bias_1, visit)
    rows = blocks[0] if len(blocks) == 1 else torch.cat(blocks)
    if visit is not None:
        rows, dest = payload.take_rows(rows, visit, False), dest[visit]
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
