"""The all-to-all of rows every expert-parallel kernel (CPU, CUDA, NPU) shares on ``torch.distributed``, and the
small all-reduce of flags. On gloo, ranks of one host move rows through shared memory (``shared_rows``), other
gloo groups point to point with the copies overlapping the transfer; NCCL, HCCL and captured graphs use
``all_to_all_single``. Every wait is bounded (``waits``). It knows rows and splits, never an op's meaning."""

from __future__ import annotations

import time

import torch.distributed as dist

from torch_ascend_moe.distributed import shared_rows
from torch_ascend_moe.distributed.capture import capturing_current_stream
from torch_ascend_moe.distributed.payload import as_bytes, gather_rows, offsets, row_bytes, take_rows
from torch_ascend_moe.distributed.waits import wait


def all_to_all_rows(op, group, pairs, out_splits, in_splits, timeout_s, index=None, padded=False, send_rows=None):
    """all_to_all_single of each ``(out, rows)`` pair of row tensors (as bytes), all in flight at once; with
    ``index``, the rows sent are ``rows[index]`` (``padded``: -1 entries send zero rows). Splits None: equal.
    ``send_rows``: every rank's splits as an [R, R] table (``send_rows[s, d]`` rows from s to d), which the
    caller's header exchange gave every rank.

    On gloo, ranks of one host with the table move the rows through shared memory (``shared_rows``); otherwise
    on gloo the exchange is point to point, ordered so the copies overlap the transfer: the rows for each peer
    are gathered and sent first, the receives land straight in ``out``, and this rank's own rows are gathered
    straight into ``out`` while the peers' bytes travel (``all_to_all_single`` would copy them once more).
    Elsewhere (NCCL, HCCL, a captured graph): gathered, then one ``all_to_all_single`` each."""
    pairs = [(out, rows) for out, rows in pairs if row_bytes(out) or row_bytes(rows)]  # zero-width metadata
    if not pairs:
        return
    if dist.get_backend(group) != "gloo" or capturing_current_stream():
        works = []
        for out, rows in pairs:
            send = rows if index is None else take_rows(rows, index, padded)
            works.append(
                dist.all_to_all_single(as_bytes(out), as_bytes(send), out_splits, in_splits, group=group, async_op=True)
            )
        for work in works:
            wait(op, group, work, timeout_s, "the all-to-all")
        return
    if send_rows is not None:
        regions = shared_rows.regions(op, group, timeout_s)
        if regions is not None and regions.exchange(op, group, pairs, send_rows, index, padded, timeout_s) is not None:
            return
    _point_to_point(op, group, pairs, out_splits, in_splits, timeout_s, index, padded)


def received_blocks(op, group, sends, rows_out, out_splits, in_splits, timeout_s, send_rows=None):
    """``all_to_all_rows`` of each tensor of ``sends`` (no index), received as blocks instead of into one tensor:
    per tensor, a list of row blocks of its dtype whose rows, one block after another, are what
    ``all_to_all_rows`` would write into ``rows_out`` rows. Through shared memory nothing is copied on the
    receiving side: the blocks are this rank's own rows and views of the peers' regions (read them before this
    rank's next header exchange on the group); otherwise one received tensor each."""
    if send_rows is not None and dist.get_backend(group) == "gloo" and not capturing_current_stream():
        regions = shared_rows.regions(op, group, timeout_s)
        got = None
        if regions is not None:
            pairs = [(None, rows) for rows in sends]
            got = regions.exchange(op, group, pairs, send_rows, None, False, timeout_s, views=True)
        if got is not None:
            return [
                [b.view(rows.dtype).view(b.shape[0], *rows.shape[1:]) for b in blocks]
                for rows, blocks in zip(sends, got)
            ]
    outs = [rows.new_empty(rows_out, *rows.shape[1:]) for rows in sends]
    all_to_all_rows(op, group, list(zip(outs, sends)), out_splits, in_splits, timeout_s, send_rows=send_rows)
    return [[out] for out in outs]


def _point_to_point(op, group, pairs, out_splits, in_splits, timeout_s, index, padded) -> None:
    r, rank = group.size(), group.rank()
    sent = pairs[0][1].shape[0] if index is None else index.shape[0]
    send_at, recv_at = offsets(in_splits, sent, r), offsets(out_splits, pairs[0][0].shape[0], r)
    # Peers in ring order from this rank, so rank i's first message goes to i + 1 while i - 1's comes to it.
    peers = [(rank + j) % r for j in range(1, r)]
    start = time.monotonic()
    works = []
    for tag, (out, _) in enumerate(pairs):
        dst = as_bytes(out)
        for p in peers:
            if recv_at[p + 1] > recv_at[p]:
                works.append(dist.irecv(dst[recv_at[p] : recv_at[p + 1]], group=group, group_src=p, tag=tag))
    for tag, (_, rows) in enumerate(pairs):
        for p in peers:
            if send_at[p + 1] > send_at[p]:
                chunk = gather_rows(rows, index, send_at[p], send_at[p + 1], padded)
                works.append(dist.isend(chunk, group=group, group_dst=p, tag=tag))
    for out, rows in pairs:  # this rank's own rows, while the peers' travel
        if recv_at[rank + 1] > recv_at[rank]:
            gather_rows(
                rows, index, send_at[rank], send_at[rank + 1], padded, as_bytes(out)[recv_at[rank] : recv_at[rank + 1]]
            )
    for work in works:
        wait(op, group, work, timeout_s, "the all-to-all", start)


def all_reduce_max(op, group, t, timeout_s, what: str = "the all-reduce") -> None:
    """``t`` (int64, a few words) becomes its elementwise maximum over the ranks."""
    regions = control_of(op, group, timeout_s)
    if regions is not None and t.device.type == "cpu" and t.numel() <= shared_rows.slot_words(group.size()):
        t.copy_(regions.all_gather(op, group, t.reshape(-1), timeout_s, what).amax(0).view_as(t))
        return
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
    wait(op, group, work, timeout_s, what)


def control_of(op: str, group, timeout_s: float):
    """The group's shared-memory regions where its small collectives go through their control blocks (gloo
    ranks of one host; see ``shared_rows``), else None. A collective on first use (the same call on every
    rank)."""
    if dist.get_backend(group) != "gloo" or capturing_current_stream():
        return None
    return shared_rows.regions(op, group, timeout_s)
