"""``deep_gemm.testing.bench``: timing helpers with upstream's signatures and units (seconds per call).

Upstream times CUDA kernels (CUDA events, the kineto profiler) after flushing L2. Here the same calls time
whatever device the work runs on: CUDA events / CUDA profiler activity when CUDA is in use, else the wall
clock and the CPU profiler, whose events are our ops (``ascend_moe::fp8_gemm`` matches ``'fp8_gemm'``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import torch

__all__ = ["bench", "bench_kineto", "empty_suppress", "suppress_stdout_stderr"]


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def bench(fn: Callable[[], object], num_warmups: int = 5, num_tests: int = 10, high_precision: bool = False) -> float:
    """Average seconds per call of ``fn`` after warm-up (CUDA events on GPU, wall clock on CPU).

    ``high_precision`` only hides CUDA launch latency upstream (a large GEMM queued first); it changes
    nothing on CPU, where nothing is queued.
    """
    for _ in range(num_warmups):
        fn()
    if _cuda_in_use():
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(num_tests):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / num_tests
    start = time.perf_counter()
    for _ in range(num_tests):
        fn()
    return (time.perf_counter() - start) / num_tests


class empty_suppress:  # noqa: N801  (upstream's name)
    """A context manager that does nothing (``bench_kineto``'s default, as upstream)."""

    def __enter__(self):
        return self

    def __exit__(self, *_):
        return None


class suppress_stdout_stderr:  # noqa: N801  (upstream's name)
    """Silence stdout and stderr at the file-descriptor level (C/C++ prints too) inside the block."""

    def __enter__(self):
        self._null = open(os.devnull, "w")  # noqa: SIM115  (closed in __exit__)
        self._fds = (sys.stdout.fileno(), sys.stderr.fileno())
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved_fds = tuple(os.dup(fd) for fd in self._fds)
        self._saved_streams = (sys.stdout, sys.stderr)
        for fd in self._fds:
            os.dup2(self._null.fileno(), fd)
        sys.stdout = sys.stderr = self._null
        return self

    def __exit__(self, *_):
        sys.stdout, sys.stderr = self._saved_streams
        for fd, saved in zip(self._fds, self._saved_fds):
            os.dup2(saved, fd)
            os.close(saved)
        self._null.close()


def bench_kineto(
    fn: Callable[[], object],
    kernel_names: str | tuple[str, ...],
    num_tests: int = 30,
    suppress_kineto_output: bool = False,
    trace_path: str | None = None,
    flush_l2: bool = True,
    with_multiple_kernels: bool = False,
    barrier: Callable[[], object] | None = None,
) -> float | tuple[float, ...]:
    """Average seconds per call of the profiler events whose name contains each of ``kernel_names``.

    As upstream: ``fn`` runs once untimed, then ``2 * num_tests`` times under ``torch.profiler`` (the
    second ``num_tests`` recorded); unless ``with_multiple_kernels``,
    a name may match at most one event kind; ``DG_USE_NVIDIA_TOOLS=1`` skips profiling and returns 1s.
    Returns a tuple when ``kernel_names`` is one. ``flush_l2`` (an 8 GB memset upstream) applies on CUDA
    only; ``barrier`` is called before each timed call (multi-rank runs).

    A name matching no event times 0 on CUDA, as upstream. Without a GPU, upstream's kernel names seldom name what
    ran (our ops, not its kernels), and its test files divide by the time: a name matching nothing times the whole
    call instead (the recorded round's wall time per call).
    """
    if not isinstance(kernel_names, (str, tuple)):
        raise TypeError(f"bench_kineto: argument 'kernel_names': expected a str or tuple, got {type(kernel_names)}")
    is_tuple = isinstance(kernel_names, tuple)
    names = kernel_names if is_tuple else (kernel_names,)
    if int(os.environ.get("DG_USE_NVIDIA_TOOLS", 0)):
        return (1,) * len(names) if is_tuple else 1

    cuda = _cuda_in_use()
    fn()
    activities = [torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU]
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
    suppress = suppress_stdout_stderr if suppress_kineto_output else empty_suppress
    rounds = []
    with suppress(), torch.profiler.profile(activities=activities, schedule=schedule) as profiler:
        for _ in range(2):
            start = time.perf_counter()
            for _ in range(num_tests):
                if flush_l2 and cuda:
                    torch.empty(int(8e9 // 4), dtype=torch.int, device="cuda").zero_()
                if barrier is not None:
                    barrier()
                fn()
            if cuda:
                torch.cuda.synchronize()
            rounds.append(time.perf_counter() - start)
            profiler.step()
    if trace_path is not None:
        profiler.export_chrome_trace(trace_path)

    events = profiler.key_averages()
    times = []
    for name in names:
        matched = [e for e in events if name in e.key]
        if not with_multiple_kernels and len(matched) > 1:
            raise AssertionError(f"bench_kineto: {name!r} matches several events: {[e.key for e in matched]}")
        # Microseconds summed over calls; device time for CUDA kernels, inclusive CPU time for our ops.
        total = sum(e.device_time_total if cuda else e.cpu_time_total for e in matched)
        count = sum(e.count for e in matched)
        times.append(total / 1e6 / count if count else (0 if cuda else rounds[-1] / num_tests))
    return tuple(times) if is_tuple else times[0]
