"""``deep_ep.utils.testing``: the timing helpers of DeepEP's tests, with upstream's signatures and units (seconds).

Upstream times CUDA kernels (CUDA events, the kineto profiler) after flushing L2. Here the same calls time
whatever device the work runs on: CUDA events / CUDA profiler activity when CUDA is in use, else the wall
clock and the CPU profiler, whose events are our ops (``ascend_moe::ep_dispatch`` matches ``'ep_dispatch'``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

from torch_ascend_moe.deep_gemm.testing.bench import empty_suppress, suppress_stdout_stderr


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def flush_l2_cache(enabled: bool = True) -> None:
    """Write 256 MB of zeros on the GPU (upstream's L2 flush); nothing without CUDA."""
    if enabled and _cuda_in_use():
        torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda").zero_()


def bench(fn, num_warmups: int = 50, num_tests: int = 50, post_fn: Callable | None = None, flush_l2: bool = True):
    """``(average, minimum, maximum)`` seconds of one ``fn()`` over ``num_tests`` timed calls after warm-up, the
    first timed call dropped (upstream's); ``post_fn`` runs after each timed call, outside the timing."""
    cuda = _cuda_in_use()
    if cuda:
        torch.cuda.synchronize()
    for _ in range(num_warmups):
        fn()
    times = []
    for _ in range(num_tests):
        flush_l2_cache(flush_l2)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        else:
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        if post_fn is not None:
            post_fn()
    if cuda:
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in times]
    times = np.array(times[1:] if len(times) > 1 else times)
    return np.average(times), np.min(times), np.max(times)


_HELPERS = "ascend_moe_kernels::"


def bench_kineto(
    fn,
    kernel_names: str | tuple,
    num_tests: int = 30,
    suppress_kineto_output: bool = False,
    trace_path: str | None = None,
    flush_l2: bool = True,
    barrier_comm_profiling: bool = False,
    num_kernels_per_period: int = 1,
    barrier: Callable | None = None,
):
    """Average seconds per call of the profiler events whose name contains each of ``kernel_names``.

    As upstream: ``fn`` runs once untimed, then ``2 * num_tests`` times under ``torch.profiler`` (the second
    ``num_tests`` recorded); a name may match at most one event kind; a name matching nothing times 0;
    ``EP_USE_NVIDIA_TOOLS=1`` skips profiling and returns 1s; ``barrier_comm_profiling`` aligns the ranks
    before each call (``barrier``, else an all-reduce; on CUDA after a ~10 ms sleep kernel, unless
    ``EP_DISABLE_BARRIER_PROFILING=1``); ``num_kernels_per_period > 1`` returns, per name, the average of each
    of the kernel's positions within a call. Returns a tuple when ``kernel_names`` is one.
    """
    if not isinstance(kernel_names, (str, tuple)):
        raise TypeError(f"bench_kineto: argument 'kernel_names': expected a str or tuple, got {type(kernel_names)}")
    is_tuple = isinstance(kernel_names, tuple)
    names = kernel_names if is_tuple else (kernel_names,)
    if int(os.environ.get("EP_USE_NVIDIA_TOOLS", 0)):
        return (1,) * len(names) if is_tuple else 1

    cuda = _cuda_in_use()
    fn()
    if cuda:
        torch.cuda.synchronize()
    barrier_comm_profiling &= int(os.environ.get("EP_DISABLE_BARRIER_PROFILING", 0)) == 0
    activities = [torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU]
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1)
    suppress = suppress_stdout_stderr if suppress_kineto_output else empty_suppress
    dummy = torch.ones(1, dtype=torch.float, device="cuda" if cuda else "cpu")
    with suppress(), torch.profiler.profile(activities=activities, schedule=schedule) as profiler:
        for _ in range(2):
            for _ in range(num_tests):
                flush_l2_cache(flush_l2)
                if barrier_comm_profiling:
                    if cuda:
                        torch.cuda._sleep(int(2e7))
                    if barrier is None:
                        dist.all_reduce(dummy)
                    else:
                        barrier()
                fn()
            if cuda:
                torch.cuda.synchronize()
            profiler.step()
    if trace_path is not None:
        profiler.export_chrome_trace(trace_path)

    # The ops' own helper kernels (namespace ascend_moe_kernels, e.g. ep_combine_reduce inside ep_combine) are steps
    # of the op a name times, not kernels of their own: upstream's "combine" must match the op alone.
    events = [e for e in profiler.key_averages() if not e.key.startswith(_HELPERS)]
    durations = []
    for name in names:
        matched = [e for e in events if name in e.key]
        if len(matched) > 1:
            raise AssertionError(f"bench_kineto: {name!r} matches several events: {[e.key for e in matched]}")
        total = sum(e.device_time_total if cuda else e.cpu_time_total for e in matched)
        count = sum(e.count for e in matched)
        durations.append(total / 1e6 / count if count else 0)
    if num_kernels_per_period > 1:
        for i, name in enumerate(names):
            calls = sorted(
                (e for e in profiler.events() if name in e.name and not e.name.startswith(_HELPERS)),
                key=lambda e: e.time_range.start,
            )
            times = [(e.device_time_total if cuda else e.cpu_time_total) / 1e6 for e in calls]
            if len(times) % num_kernels_per_period:
                raise AssertionError(
                    f"bench_kineto: {len(times)} {name!r} events are not a multiple of {num_kernels_per_period}"
                )
            periods = len(times) // num_kernels_per_period
            durations[i] = [sum(times[j::num_kernels_per_period]) / periods for j in range(num_kernels_per_period)]
    return tuple(durations) if is_tuple else durations[0]


__all__ = ["bench", "bench_kineto", "empty_suppress", "flush_l2_cache", "suppress_stdout_stderr"]
