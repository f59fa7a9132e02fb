"""What every expert-parallel kernel (CPU, CUDA, NPU) shares on ``torch.distributed``: bounded waits, the
all-to-all of rows, and the header exchange.

Before moving data, every rank ``all_gather``s one fixed-length header (the op, its shapes, dtypes, options,
local validation result and per-rank counts), so a mismatch between ranks, different ops, or a bad argument on
one rank raises a clear error on every rank instead of a hang. Every collective waits at most ``timeout_s``: a
rank that never arrives produces an error on the others. Rows travel as bytes (any dtype, FP8 included).
"""

from __future__ import annotations

import datetime
import itertools
import threading
import time
import zlib

import torch
import torch.distributed as dist

from torch_ascend_moe.distributed import capture, shared_rows
from torch_ascend_moe.distributed.capture import capturing, capturing_current_stream
from torch_ascend_moe.distributed.groups import resolve_group


def wait(op: str, group, work, timeout_s: float, what: str, start: float | None = None) -> None:
    """``work.wait()`` with a deadline ``timeout_s`` after ``start`` (``time.monotonic()``; default now), raising
    a message that tells a timeout from a transport failure."""
    if capturing_current_stream():
        work.wait()  # a deadline is a host-side wait, illegal in a capture: the stream waits instead
        return
    start = time.monotonic() if start is None else start
    try:
        left = max(timeout_s - (time.monotonic() - start), 1e-3)
        work.wait(timeout=datetime.timedelta(seconds=left))
    except RuntimeError as e:
        elapsed = time.monotonic() - start
        if elapsed < 0.9 * timeout_s:  # the transport failed before the deadline: not a timeout
            raise failed_error(op, group, what, elapsed, timeout_s, e) from e
        raise timeout_error(op, group, what, timeout_s, e) from e


def failed_error(op: str, group, what: str, elapsed: float, timeout_s: float, detail) -> RuntimeError:
    return RuntimeError(
        f"{op}: rank {group.rank()} of {group.size()}: {what} failed after {elapsed:.3g} s, before its "
        f"{timeout_s:g} s timeout (a peer rank exited or crashed, or its connection broke): {detail}"
    )


def timeout_error(op: str, group, what: str, timeout_s: float, detail) -> RuntimeError:
    return RuntimeError(
        f"{op}: rank {group.rank()} of {group.size()}: {what} did not complete within {timeout_s:g} s "
        f"(a rank never arrived, or the ranks called different ops): {detail}"
    )


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


def offsets(splits, rows: int, r: int) -> list[int]:
    """Where each rank's rows start (and, last, the total): ``splits`` summed up; None: ``rows`` split equally."""
    return list(itertools.accumulate([rows // r] * r if splits is None else splits, initial=0))


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


def row_bytes(t: torch.Tensor) -> int:
    """Bytes per row of ``[rows, ...]``."""
    width = t.element_size()
    for d in t.shape[1:]:
        width *= d
    return width


def gather_rows(rows, index, begin: int, end: int, padded: bool, out=None) -> torch.Tensor:
    """Rows ``begin:end`` of what is sent (``rows[index]``, or ``rows`` without an index) as bytes, into ``out``
    (uint8 ``[end - begin, row bytes]``) if given."""
    src = as_bytes(rows)
    if index is None:
        return src[begin:end] if out is None else out.copy_(src[begin:end])
    idx = index[begin:end]
    if out is None:
        out = new_rows(src, end - begin, src.shape[1])
    if not src.shape[0]:  # nothing to take from: only padding can be asked for
        return out.zero_()
    # uint8 rows: CPU index_select copies whole rows of bytes (int64 words take a per-element path, 5x slower).
    torch.index_select(src, 0, idx.clamp(min=0) if padded else idx, out=out)
    if padded:  # zero the padding rows through 8-byte words when the width allows (a byte-wise fill is 2x slower)
        words = out.view(torch.int64) if out.shape[1] % 8 == 0 and out.shape[1] else out
        words.masked_fill_((idx < 0).unsqueeze(1), 0)
    return out


def all_reduce_max(op, group, t, timeout_s, what: str = "the all-reduce") -> None:
    """``t`` (int64, a few words) becomes its elementwise maximum over the ranks."""
    regions = _control_of(op, group, timeout_s)
    if regions is not None and t.device.type == "cpu" and t.numel() <= shared_rows.slot_words(group.size()):
        t.copy_(regions.all_gather(op, group, t.reshape(-1), timeout_s, what).amax(0).view_as(t))
        return
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
    wait(op, group, work, timeout_s, what)


def _control_of(op: str, group, timeout_s: float):
    """The group's shared-memory regions where its small collectives go through their control blocks (gloo
    ranks of one host; see ``shared_rows``), else None. A collective on first use (the same call on every
    rank)."""
    if dist.get_backend(group) != "gloo" or capturing_current_stream():
        return None
    return shared_rows.regions(op, group, timeout_s)


# Header words: op code, then the op's fields, error flags and per-rank counts, zero-padded to a length every
# rank knows without asking (fields and flags < 32, counts <= 2 per rank), so one all_gather carries it even
# when the ranks called different ops.
REJECTED = -1  # the op code of a rank whose own arguments failed their local check


def op_code(op: str) -> int:
    """A header's op code: a checksum of the op's name, the same in every process, so any op can exchange a header
    without a list of them kept here."""
    return zlib.crc32(op.encode()) & 0x7FFFFFFF


def _op_names(codes: list[int]) -> list[str]:
    """The ops behind header codes (any ``ascend_moe`` op), for the error that names them."""
    from torch_ascend_moe._registry import NAMESPACE, op_names

    known = {op_code(f"{NAMESPACE}::{name}"): f"{NAMESPACE}::{name}" for name in op_names()}
    return [known.get(c, f"op code {c}") for c in codes]


def gather_header(op: str, group, device, code: int, words: list[int], extra, timeout_s) -> torch.Tensor:
    length = shared_rows.slot_words(group.size())
    row = torch.zeros(length, dtype=torch.int64)
    row[0] = code
    row[1 : 1 + len(words)] = torch.tensor(words, dtype=torch.int64)
    if extra is not None:
        row[1 + len(words) : 1 + len(words) + extra.numel()] = extra.to("cpu", torch.int64)
    regions = _control_of(op, group, timeout_s)
    if regions is not None:
        table = regions.all_gather(op, group, row, timeout_s, "the header exchange")
    else:
        row = row.to(device)
        gathered = [torch.empty_like(row) for _ in range(group.size())]
        wait(op, group, dist.all_gather(gathered, row, group=group, async_op=True), timeout_s, "the header exchange")
        table = torch.stack(gathered).cpu()
    codes = table[:, 0].tolist()
    rejected = [i for i, c in enumerate(codes) if c == REJECTED]
    if rejected:
        raise ValueError(
            f"{op}: rank(s) {rejected} rejected their arguments (the error raised on those ranks names the "
            "argument); no rows were exchanged"
        )
    if len(set(codes)) > 1:
        raise ValueError(f"{op}: the ranks called different ops: {_op_names(codes)} (rank i's at position i)")
    return table[:, 1:]


def announce_rejection(op: str, group_name, x, timeout_s) -> None:
    """Tell the other ranks (waiting in the header exchange) that this rank's arguments failed their check, so
    they raise at once instead of timing out. Best effort: the caller raises its own error either way."""
    try:
        group = resolve_group(op, group_name)
        if dist.get_backend(group) == "nccl":
            device = torch.device("cuda", torch.cuda.current_device())
        else:
            device = x.device if isinstance(x, torch.Tensor) else torch.device("cpu")
        if capturing(device):
            return
        if isinstance(timeout_s, (int, float)) and timeout_s > 0:
            timeout = float(timeout_s)
        else:  # the rejected argument may be the timeout itself: wait the op's default for the others
            from torch_ascend_moe._registry import schema_default

            timeout = float(schema_default(op, "timeout_s"))
        gather_header(op, group, device, REJECTED, [], None, timeout)
    except (ValueError, RuntimeError, TypeError):
        pass


def checked(op: str, group_name, x, timeout_s, check):
    """``check()`` (an op's argument check); on failure, announce it to the other ranks and re-raise."""
    try:
        return check()
    except ValueError:
        announce_rejection(op, group_name, x, timeout_s)
        raise


def exchange_header(op: str, group, device, fields: dict, extra: torch.Tensor | None, errors: dict, timeout_s):
    """all_gather every rank's ``fields`` (ints that must agree), ``errors`` (name -> (failed here, message with
    a ``{ranks}`` placeholder)) and ``extra`` (per-rank ints); raise the same error on every rank on any
    disagreement or failure."""
    names = list(fields)
    words = [int(fields[n]) for n in names] + [int(errors[n][0]) for n in errors]
    table = gather_header(op, group, device, op_code(op), words, extra, timeout_s)
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
    n_extra = 0 if extra is None else extra.numel()
    return table[:, len(words) : len(words) + n_extra]


# ---- row payloads ----


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """``[rows, ...]`` as ``[rows, bytes per row]`` uint8."""
    width = row_bytes(t)
    if t.numel() == 0:  # empty tensors count as contiguous whatever their strides, and may not be viewable
        return torch.empty(t.shape[0], width, dtype=torch.uint8, device=t.device)
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], width)


# ---- CPU outputs without fresh pages ----

# glibc maps blocks of 32 MiB or more fresh, and smaller ones come from a heap whose top it trims back to the kernel
# once more than twice its (dynamic) mmap threshold lies free: a dispatch's 2 MB receive buffer was 244 page faults
# per call at T=256 (435 at T=1024), more time than moving its rows.
_REUSE_MIN_BYTES = 256 << 10
_REUSE_KEEP = 4  # storages kept for reuse (a step's dispatch and combine outputs): resident while unused
_kept: list[torch.UntypedStorage] = []
_kept_lock = threading.Lock()


def new_rows(like: torch.Tensor, rows: int, *shape: int) -> torch.Tensor:
    """``like.new_empty(rows, *shape)``. On CPU a block of 256 KiB or more takes the memory of an earlier block
    that no tensor references any more: a fresh block is pages faulted in and zeroed on first touch, which costs
    more than filling them (35 ms for 48 MiB on the 2-core CI machine, 3x the copy; the CUDA caching allocator
    avoids the same cost there)."""
    nbytes = like.element_size() * rows
    for d in shape:
        nbytes *= d
    if nbytes < _REUSE_MIN_BYTES or like.device.type != "cpu" or not capture.host_readable(like):
        return like.new_empty(rows, *shape)
    with _kept_lock:
        for storage in _kept:
            # Use count 1: only this list holds the storage (a tensor or view of it anywhere holds another).
            if nbytes <= storage.nbytes() <= 2 * nbytes and torch._C._storage_Use_Count(storage._cdata) == 1:
                _kept.remove(storage)
                _kept.append(storage)
                return like.new_empty(0).set_(storage, 0, (rows, *shape))
        out = like.new_empty(rows, *shape)
        _kept.append(out.untyped_storage())
        del _kept[:-_REUSE_KEEP]
        return out


def take_rows(rows: torch.Tensor, index: torch.Tensor, padded: bool) -> torch.Tensor:
    """``rows[index]`` (any dtype); with ``padded``, -1 entries give zero rows. No host sync."""
    out = gather_rows(rows, index, 0, index.shape[0], padded)
    return out.view(rows.dtype).view(index.shape[0], *rows.shape[1:])


def place_rows(rows: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """``out[index[i]] = rows[i]`` into ``n`` zero rows; -1 entries are dropped. No host sync (they land in a
    spare row)."""
    b = as_bytes(rows)
    width = b.shape[1]
    # 8-byte words when the width allows: CPU index_copy_ of byte rows goes element by element.
    word = torch.int64 if width % 8 == 0 else torch.uint8
    buf = b.new_zeros(n + 1, width)
    if rows.shape[0]:
        buf.view(word).index_copy_(0, torch.where(index >= 0, index, n), b.view(word))
    return buf[:n].view(rows.dtype).view(n, *rows.shape[1:])


def pad8(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Payload parts padded with zero bytes to a multiple of 8 bytes per row."""
    width = sum(p.shape[1] for p in parts)
    pad = (-width) % 8
    return parts + [parts[0].new_zeros(parts[0].shape[0], pad)] if pad else parts


def join(parts: list[torch.Tensor]) -> torch.Tensor:
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # one part: its own bytes, no copy


def split(payload: torch.Tensor, widths: list[int]) -> list[torch.Tensor]:
    if widths and widths[0] == payload.shape[1]:
        return [payload]  # one part: no copy
    out, start = [], 0
    for w in widths:
        out.append(payload[:, start : start + w].clone(memory_format=torch.contiguous_format))
        start += w
    return out


DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.int32, torch.int64)


def dtype_code(dtype) -> int:
    """A rank-independent number for a dtype (the header carries ints)."""
    return DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES)
