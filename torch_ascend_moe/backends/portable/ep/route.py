"""A dispatch's handle as a route: its counts checked to pair up on every rank, then the splits, sizes and
shape of the rows it moves. The cached dispatch replays it; the combine runs it backwards."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.backends.portable.ep.header import Transport, checked_on_every_rank
from torch_ascend_moe.distributed import agreement, capture
from torch_ascend_moe.distributed.groups import resolve_group


class Route(NamedTuple):
    """How a handle's rows move: splits (None = equal splits), buffer sizes, whether the handle is compact."""

    in_splits: list[int] | None  # rows this rank's send buffer holds per destination (dispatch direction)
    out_splits: list[int] | None  # rows it receives per source (dispatch direction)
    rows_out: int  # rows of the dispatch's receive buffer
    rows_in: int  # rows of the dispatch's send buffer
    compact_recv: bool  # recv_gather is the identity: outputs are the receive buffer itself
    padded_send: bool  # send_src holds -1 padding
    send_rows: torch.Tensor | None  # [R, R]: rows rank s sends rank d in the dispatch direction (None: capturing)


def cached_row_errors(op: str, x: torch.Tensor, send_src: torch.Tensor) -> dict:
    """A cached dispatch's header error: every row the handle sends must be a row of ``x`` (its dispatch's tokens).
    A short ``x`` would fail on its rank alone after the header, or send wrong rows; flagged in the header, every
    rank raises. A host read (never while capturing)."""
    top = int(send_src.max()) if send_src.numel() else -1
    expected = "the tokens of the handle's dispatch (a row for every row the handle sends) on every rank"
    return {"x's rows": (top >= x.shape[0], ck.message(op, "x", "size(0)", expected, "fewer rows on rank(s) {ranks}"))}


def handle_route(
    op, group, device, send_src, send_counts, recv_counts, recv_gather, fields, timeout_s, errors=None
) -> Route:
    """Check a dispatch handle on every rank (its counts must pair up: rank s sends rank d what d expects from s)
    and return its route. While a CUDA graph is captured nothing is read on the host: only a static handle
    (equal splits, every rank the same T) can be replayed then, and nothing is checked. ``errors()``: more header
    errors (``agreement.exchange_header``'s), asked for only when not capturing."""
    r, rank = group.size(), group.rank()
    if capture.capturing(device):
        rows = send_src.shape[0]  # static: R * T rows each way
        return Route(None, None, rows, rows, False, True, None)
    table = agreement.exchange_header(
        op, group, device, fields, torch.cat([send_counts, recv_counts]).cpu(), errors() if errors else {}, timeout_s
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
    return Route(in_splits, out_splits, rows_out, sum(in_splits), compact, bool((send_src < 0).any()), sends)


def checked_route(
    op: str, signature, fields, args, transport: Transport, errors: Callable[[], dict] | None = None
) -> tuple[int, object, Route]:
    """What every replay of a handle (cached dispatch, combine) checks first, whichever transport then moves the
    rows: the op's arguments on every rank with one verdict, then the handles paired up across ranks (a mismatch
    raises on every rank, where DeepEP would wait). ``fields(args, transport)``: the header's fields; ``errors``:
    more header errors (``handle_route``). Returns ``(R, group, route)``."""
    r = checked_on_every_rank(op, args, signature)
    group = resolve_group(op, args.group_name)
    route = handle_route(
        op,
        group,
        args.x.device,
        args.send_src,
        args.send_counts,
        args.recv_counts,
        args.recv_gather,
        fields(args, transport),
        args.timeout_s,
        errors,
    )
    return r, group, route
