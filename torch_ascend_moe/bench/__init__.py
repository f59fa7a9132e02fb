"""Benchmarks: ``python -m torch_ascend_moe bench <family>``.

Each family module exposes ``cases(quick) -> list[Case]``. A case times our op and a baseline in the same
run (machines here are noisy: only the ratio is meaningful), the two in alternating blocks (``_paired_seconds``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import importlib
import importlib.util
import os
import pkgutil
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch

from torch_ascend_moe import checks as ck

# Every module of this package is a family's cases (no list is typed here).
FAMILIES = tuple(sorted(m.name for m in pkgutil.iter_modules(__path__)))
# Workload options a family may read (``bench ep``: --tokens, --hidden, --topk, --experts); set by the CLI.
OPTIONS: dict[str, int] = {}
# Names that run several families: ``bench fp8`` covers every FP8 op.
GROUPS = {"fp8": ("fp8_gemm", "fp8_linear", "quant")}


@dataclasses.dataclass
class Case:
    name: str
    flops: int
    setup: Callable[[], tuple[Callable[[], object], Callable[[], object]]]  # -> (ours, baseline)
    baseline: str
    memory: bool = False  # also measure each side's peak memory (one extra call each)
    grad: bool = False  # the callables run a backward: time them with autograd enabled
    bytes: int | Callable[[], float] = 0  # bytes moved per call (communication; may be known after setup): GB/s
    iterations: int = 0  # a fixed count (collectives: every rank must run the same number), else adaptive
    # also profile one baseline call: the share of its time in ATen's matrix multiplies, which bounds what any change
    # outside them (a fusion) can gain: ``Result.bound``
    bound: bool = False
    faults: bool = False  # also count each side's minor page faults per call (fresh pages it touches): ``page_faults``


def layer_call(module: Callable, x: torch.Tensor, grad: bool) -> Callable[[], torch.Tensor]:
    """A case's timed call of a layer: its forward without autograd, or forward + backward of the output's sum
    (returning the input's gradient)."""

    def call():
        if not grad:
            with torch.no_grad():
                return module(x)
        xg = x.detach().requires_grad_()
        module(xg).sum().backward()
        return xg.grad

    return call


@dataclasses.dataclass
class Result:
    case: str
    baseline: str
    ours_ms: float
    baseline_ms: float
    ours_tflops: float
    baseline_tflops: float
    ours_peak_mb: float | None = None
    baseline_peak_mb: float | None = None
    ours_gbps: float | None = None
    baseline_gbps: float | None = None
    baseline_gemm_share: float | None = None
    ours_faults: float | None = None
    baseline_faults: float | None = None

    @property
    def speedup(self) -> float:
        """Baseline time over ours: above 1 means our op is faster."""
        return self.baseline_ms / self.ours_ms

    @property
    def bound(self) -> float | None:
        """Amdahl's bound on the speedup of anything that leaves the baseline's GEMMs as they are: all its other work
        removed at no cost leaves the GEMMs' time, ``GEMM share`` of the baseline's: ``1 / GEMM share``."""
        share = self.baseline_gemm_share
        return None if share is None else 1 / max(share, 1e-9)


def machine() -> dict[str, object]:
    """What a stored run (``bench --json``, ``docs/bench/``) needs to be read later: the CPU, its core count, the GPU
    if one is visible, and the software versions. Example: ``machine()["cpu_count"] == os.cpu_count()``."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    triton = importlib.util.find_spec("triton")
    return {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "triton": importlib.import_module("triton").__version__ if triton else None,
        "python": platform.python_version(),
    }


def _clock() -> Callable[[], float]:
    """A clock that first waits for the accelerator's queued work where there is one (as benchmark.Timer's)."""
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is None or not accelerator.is_available():
        return time.perf_counter

    def synchronized() -> float:
        accelerator.synchronize()
        return time.perf_counter()

    return synchronized


# Seconds per block of calls in ``_paired_seconds``: fast ops run many calls per reading of the clock.
_BLOCK_SECONDS = 1e-3
_MIN_BLOCKS = 5


def _paired_seconds(ours: Callable[[], object], base: Callable[[], object], min_run_time: float) -> tuple[float, float]:
    """Seconds per call of ``ours`` and ``base`` (the mean of the middle 80 % of their blocks), timed in alternating
    blocks (one call, or as many as fill about a millisecond) until each side has run ``2 * min_run_time`` and at
    least ``_MIN_BLOCKS`` blocks.

    Alternating block by block, any drift of the machine (clock frequency, a neighbour's load) falls on both sides
    alike. Timing each side in phases of ``min_run_time`` moved the ratio of one build by 0.93-1.10 between runs
    of ``bench moe``'s MegaMoE rows (issue 51). Each side runs after the other, as a layer runs after other
    layers in a model, not in caches warmed by its own previous call. The order flips every round (ours, base,
    base, ours, ...): with another process on one core, calls of a few milliseconds fell into a rhythm with the
    scheduler, every other call slow, and a fixed order gave one side all the slow calls (the same GEMM timed
    against itself read 5.4 and 2.9 ms). For the same reason the statistic is a trimmed mean, not the median: the
    median of calls that are half slow and half fast is whichever half has one call more."""
    clock = _clock()
    sides = (ours, base)
    calls = []
    for fn in sides:
        fn()  # warm-up
        start = clock()
        fn()
        calls.append(max(1, int(_BLOCK_SECONDS / max(clock() - start, 1e-9))))
    times: tuple[list[float], list[float]] = ([], [])
    spent = [0.0, 0.0]
    collecting = gc.isenabled()
    gc.disable()  # as timeit: a collection lands on whichever side happens to allocate then
    try:
        while min(spent) < 2 * min_run_time or len(times[1]) < _MIN_BLOCKS:
            order = (0, 1) if len(times[0]) % 2 == 0 else (1, 0)
            for side in order:
                fn = sides[side]
                start = clock()
                for _ in range(calls[side]):
                    fn()
                elapsed = clock() - start
                spent[side] += elapsed
                times[side].append(elapsed / calls[side])
    finally:
        if collecting:
            gc.enable()
    return _trimmed_mean(times[0]), _trimmed_mean(times[1])


def _trimmed_mean(values: list[float], cut: float = 0.1) -> float:
    """The mean of ``values`` without the lowest and the highest ``cut`` of them (at least one value kept)."""
    ordered = sorted(values)
    drop = min(int(len(ordered) * cut), (len(ordered) - 1) // 2)
    kept = ordered[drop : len(ordered) - drop]
    return sum(kept) / len(kept)


def peak_memory_mb(fn: Callable[[], object]) -> float | None:
    """Resident-memory growth (MB) while ``fn`` runs: Linux's peak-RSS counter, reset just before the call.

    Large tensors are mmap-backed, so what an op allocates and touches shows up here; None where the kernel
    does not allow resetting the counter (``/proc/self/clear_refs``).
    """

    def read(field: str) -> int:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field))

    # glibc serves blocks below its (self-raising, up to 32 MB) mmap threshold from memory the process already
    # holds, which would hide them: during the measurement every block of 64 KB or more gets fresh pages, and
    # free heap pages are returned first.
    libc = _glibc()
    try:
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, 64 << 10)
            libc.malloc_trim(0)  # hand freed heap pages back, so reusing them counts as growth too
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        before = read("VmRSS:")
        fn()
        return (read("VmHWM:") - before) / 1024
    except OSError:
        return None
    finally:
        if libc is not None:
            libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # where glibc's dynamic threshold settles


_M_MMAP_THRESHOLD = -3


# ATen's matrix multiplies (what oneDNN / the BLAS runs), by the profiler's event names: the GEMM work a fusion of the
# steps around them keeps. Our own GEMM kernels (the FP8 ones; BF16 on CPUs without BF16 dot products) are not
# counted, so the bound is loose there, never too tight.
_ATEN_GEMMS = frozenset(
    f"aten::{name}" for name in ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm", "_scaled_mm", "mv", "addmv", "dot")
)


def page_faults(fn: Callable[[], object], calls: int = 5) -> float:
    """Minor page faults per call of ``fn`` (median of ``calls`` after a warm-up): the fresh pages it touches, each
    zeroed by the kernel. Large tensors are mmap-backed, so a step that allocates them anew pays this every time."""
    import resource

    fn()
    counts = []
    for _ in range(calls):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn()
        counts.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return statistics.median(counts)


def gemm_share(fn: Callable[[], object], calls: int = 3) -> float:
    """The share of ``fn``'s wall time spent in ATen's matrix multiplies (their own time, without what they call),
    over ``calls`` profiled calls after a warm-up."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        wall = time.perf_counter() - start
    gemms = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in _ATEN_GEMMS) / 1e6
    return min(gemms / wall, 1.0)


@contextlib.contextmanager
def busy_core():
    """Another process keeping one core busy while the block runs (``bench --busy``): a single-threaded spin loop,
    what a data loader or a second job does to a training process on a shared machine. Yields the process."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # running before the first timing
        yield spinner
    finally:
        spinner.kill()
        spinner.wait()


def _glibc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _fixed_seconds(fn: Callable[[], object], iterations: int) -> float:
    """The median of ``iterations`` single calls (a fixed count, so every rank of a collective runs the same
    calls): one stalled call on a noisy machine moves a block's mean, not the median."""
    fn()  # warm-up
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_case(case: Case, min_run_time: float = 0.3) -> Result:
    ours, base = case.setup()
    with torch.set_grad_enabled(case.grad):
        if case.iterations:
            # Interleave so that drift in machine load hits both sides alike.
            t_ours = _fixed_seconds(ours, case.iterations)
            t_base = _fixed_seconds(base, case.iterations)
            t_ours = min(t_ours, _fixed_seconds(ours, case.iterations))
            t_base = min(t_base, _fixed_seconds(base, case.iterations))
        else:
            t_ours, t_base = _paired_seconds(ours, base, min_run_time)
        peaks = (peak_memory_mb(ours), peak_memory_mb(base)) if case.memory else (None, None)
        share = gemm_share(base) if case.bound else None
        faults = (page_faults(ours), page_faults(base)) if case.faults else (None, None)
    moved = case.bytes() if callable(case.bytes) else case.bytes
    gbps = (moved / t_ours / 1e9, moved / t_base / 1e9) if moved else (None, None)
    return Result(
        case.name,
        case.baseline,
        t_ours * 1e3,
        t_base * 1e3,
        case.flops / t_ours / 1e12,
        case.flops / t_base / 1e12,
        *peaks,
        *gbps,
        share,
        *faults,
    )


def cases(family: str, quick: bool = False) -> list[Case]:
    if family in GROUPS:
        return [c for f in GROUPS[family] for c in cases(f, quick)]
    if family not in FAMILIES:
        expected = ", ".join((*FAMILIES, *GROUPS))
        raise ValueError(ck.message("bench", "family", "value", f"one of {expected}", repr(family)))
    return importlib.import_module(f"torch_ascend_moe.bench.{family}").cases(quick)
