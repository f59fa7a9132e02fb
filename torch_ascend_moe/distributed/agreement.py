"""The agreement step before any rows move: every rank ``all_gather``s one fixed-length header (the op, its
shapes, dtypes, options, local validation result and per-rank counts), so a mismatch between ranks, different
ops, or a bad argument on one rank raises the same clear error on every rank instead of a hang. A rank whose own
arguments fail announces it (``checked``), so the others raise at once instead of timing out."""

from __future__ import annotations

import zlib

import torch
import torch.distributed as dist

from torch_ascend_moe._registry import NAMESPACE, op_names, schema_default
from torch_ascend_moe.distributed import shared_rows
from torch_ascend_moe.distributed.capture import capturing
from torch_ascend_moe.distributed.groups import resolve_group
from torch_ascend_moe.distributed.transport import control_of
from torch_ascend_moe.distributed.waits import wait

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
    known = {op_code(f"{NAMESPACE}::{name}"): f"{NAMESPACE}::{name}" for name in op_names()}
    return [known.get(c, f"op code {c}") for c in codes]


def gather_header(op: str, group, device, code: int, words: list[int], extra, timeout_s) -> torch.Tensor:
    length = shared_rows.slot_words(group.size())
    row = torch.zeros(length, dtype=torch.int64)
    row[0] = code
    row[1 : 1 + len(words)] = torch.tensor(words, dtype=torch.int64)
    if extra is not None:
        row[1 + len(words) : 1 + len(words) + extra.numel()] = extra.to("cpu", torch.int64)
    regions = control_of(op, group, timeout_s)
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


DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.float8_e4m3fn, torch.int32, torch.int64)


def dtype_code(dtype) -> int:
    """A rank-independent number for a dtype (the header carries ints)."""
    return DTYPES.index(dtype) if dtype in DTYPES else len(DTYPES)
