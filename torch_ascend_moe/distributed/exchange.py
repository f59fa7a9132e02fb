"""What every expert-parallel kernel (CPU, CUDA, NPU) shares on ``torch.distributed``: bounded waits, the
all-to-all of rows, and the header exchange.

Before moving data, every rank ``all_gather``s one fixed-length header (the op, its shapes, dtypes, options,
local validation result and per-rank counts), so a mismatch between ranks, different ops, or a bad argument on
one rank raises a clear error on every rank instead of a hang. Every collective waits at most ``timeout_s``: a
rank that never arrives produces an error on the others. Rows travel as bytes (any dtype, FP8 included).
"""

from __future__ import annotations

import datetime
import time

import torch
import torch.distributed as dist

from torch_ascend_moe.distributed.capture import capturing, capturing_current_stream
from torch_ascend_moe.distributed.groups import resolve_group
from torch_ascend_moe.meta import ep as meta


def wait(op: str, group, work, timeout_s: float, what: str) -> None:
    if capturing_current_stream():
        work.wait()  # a deadline is a host-side wait, illegal in a capture: the stream waits instead
        return
    start = time.monotonic()
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout_s))
    except RuntimeError as e:
        elapsed = time.monotonic() - start
        if elapsed < 0.9 * timeout_s:  # the transport failed before the deadline: not a timeout
            raise RuntimeError(
                f"{op}: rank {group.rank()} of {group.size()}: {what} failed after {elapsed:.3g} s, before its "
                f"{timeout_s:g} s timeout (a peer rank exited or crashed, or its connection broke): {e}"
            ) from e
        raise RuntimeError(
            f"{op}: rank {group.rank()} of {group.size()}: {what} did not complete within {timeout_s:g} s "
            f"(a rank never arrived, or the ranks called different ops): {e}"
        ) from e


def all_to_all_rows(op, group, pairs, out_splits, in_splits, timeout_s) -> None:
    """all_to_all_single of each (out, in) pair of row tensors (as bytes), all in flight at once."""
    works = []
    for out, inp in pairs:
        if out.shape[1:].numel() == 0 and inp.shape[1:].numel() == 0:
            continue  # zero-width rows (H = 0 is rejected earlier, but zero-column metadata is possible)
        works.append(
            dist.all_to_all_single(as_bytes(out), as_bytes(inp), out_splits, in_splits, group=group, async_op=True)
        )
    for work in works:
        wait(op, group, work, timeout_s, "the all-to-all")


def all_reduce_max(op, group, t, timeout_s) -> None:
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
    wait(op, group, work, timeout_s, "the all-reduce")


# Header words: op code, then the op's fields, error flags and per-rank counts, zero-padded to a length every
# rank knows without asking (fields and flags < 32, counts <= 2 per rank), so one all_gather carries it even
# when the ranks called different ops.
OPS = (meta.DISPATCH, meta.CACHED, meta.COMBINE, meta.LL_DISPATCH, meta.LL_COMBINE)
REJECTED = -1  # the op code of a rank whose own arguments failed their local check


def gather_header(op: str, group, device, code: int, words: list[int], extra, timeout_s) -> torch.Tensor:
    length = 32 + 2 * group.size()
    row = torch.zeros(length, dtype=torch.int64)
    row[0] = code
    row[1 : 1 + len(words)] = torch.tensor(words, dtype=torch.int64)
    if extra is not None:
        row[1 + len(words) : 1 + len(words) + extra.numel()] = extra.to("cpu", torch.int64)
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
        raise ValueError(f"{op}: the ranks called different ops: {[OPS[c] for c in codes]} (rank i's at position i)")
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
    table = gather_header(op, group, device, OPS.index(op), words, extra, timeout_s)
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
    width = t.element_size()
    for d in t.shape[1:]:
        width *= d
    if t.numel() == 0:  # empty tensors count as contiguous whatever their strides, and may not be viewable
        return torch.empty(t.shape[0], width, dtype=torch.uint8, device=t.device)
    return t.contiguous().view(torch.uint8).reshape(t.shape[0], width)


def take_rows(rows: torch.Tensor, index: torch.Tensor, padded: bool) -> torch.Tensor:
    """``rows[index]`` (any dtype); with ``padded``, -1 entries give zero rows. No host sync."""
    b = as_bytes(rows)
    if not b.shape[0]:
        return rows.new_zeros(index.shape[0], *rows.shape[1:])
    # uint8 rows: CPU index_select copies whole rows of bytes (int64 words take a per-element path, 5x slower).
    out = b.index_select(0, index.clamp(min=0) if padded else index)
    if padded:
        # Zero the padding rows through 8-byte words when the width allows (a byte-wise fill is 2x slower).
        words = out.view(torch.int64) if out.shape[1] % 8 == 0 and out.shape[1] else out
        words.masked_fill_((index < 0).unsqueeze(1), 0)
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
