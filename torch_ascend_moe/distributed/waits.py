"""Bounded waits: every collective of the expert-parallel stack waits at most its op's ``timeout_s``, and a wait
that ends early tells a transport failure (a peer exited, a connection broke) from a timeout (a rank never
arrived, or the ranks called different ops), naming the op and this rank on every rank."""

from __future__ import annotations

import datetime
import time

from torch_ascend_moe.distributed.capture import capturing_current_stream


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


def out_of_step_error(op: str, group, what: str, peer: int, where: str) -> RuntimeError:
    return RuntimeError(
        f"{op}: rank {group.rank()} of {group.size()}: {what}: rank {peer} arrived {where}: the ranks are out of "
        "step (a rank raised between two steps of an op, or the ranks called different sequences of collectives); "
        "nothing was received in this step"
    )
