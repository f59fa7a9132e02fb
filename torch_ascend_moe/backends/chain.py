"""Kernel choice as data: per op and device, an ordered chain of kernels, and one lookup that picks.

Every device kernel declares which calls it takes (``takes(*args) -> Verdict``, vLLM's ``is_supported_config``
habit) and, for a library that may be missing, whether it is there (``available() -> Verdict``). A chain is
ordered by tier, then by declaration:

    upstream library's kernel (DeepGEMM, DeepEP, FlashMLA, TileKernels, DeepSelect: what the product serves)
      -> the vendor's op (ATen / cuBLAS, torch_npu)
      -> our own kernel (Triton, C++)
      -> the portable kernel (device-generic torch ops; takes every call)

``choose`` walks the chain and returns the first kernel that is enabled, available and takes the call; nothing
else decides (a kernel body never falls back by itself). The first device kernel declared for an op registers
ONE dispatcher kernel on that device's key, which runs ``choose``; ops with no device kernel keep the portable
kernel (``CompositeExplicitAutograd``) there with no Python in between. On CPU the dispatcher's C++ kernel is the
chain's first entry (built in, not switchable).

Switches: ``TORCH_ASCEND_MOE_DISABLE=deep_gemm,fp8_gemm:triton`` (a library everywhere, or one op's kernel of a
library) read at every choice, and ``disabled(...)`` for a block of code. ``explain`` says which kernel a call takes
and why each earlier one refused; ``python -m torch_ascend_moe info`` prints the chains and ``info --explain``
explains a call. ``on_cpu("cuda")`` runs CPU tensors through a device's chains (how CI checks them without the
device). ``refresh()`` forgets which libraries were found (after installing or removing one in a running process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import types
from collections.abc import Callable, Iterator
from typing import NamedTuple

import torch

from torch_ascend_moe import _registry

ENV = "TORCH_ASCEND_MOE_DISABLE"
DEVICE_KEYS = {"cpu": "CPU", "cuda": "CUDA", "npu": "PrivateUse1"}
TIERS = ("upstream", "vendor", "ours", "portable")
# The switchable names: each library's tier. A dotted name is a part of a library with kernels of its own for the
# same ops (DeepEP's V1 ``Buffer`` and V2 ``ElasticBuffer``): switched off by its own name or the library's.
LIBRARIES = {
    "deep_gemm": "upstream",
    "deep_ep": "upstream",
    "deep_ep.legacy": "upstream",
    "deep_ep.elastic": "upstream",
    "flash_mla": "upstream",
    "tile_kernels": "upstream",
    "deep_select": "upstream",
    "aten": "vendor",
    "torch_npu": "vendor",
    "triton": "ours",
    "cpp": "ours",
    "portable": "portable",
}


class Verdict(NamedTuple):
    """A kernel's answer to a call (or a library's to "are you there"): ``ok``, and why not when it is not."""

    ok: bool
    reason: str


TAKEN = Verdict(True, "takes the call")


def refuse(reason: str) -> Verdict:
    return Verdict(False, reason)


def takes_all(*args, **kwargs) -> Verdict:
    return TAKEN


class planned:
    """A ``takes`` from a function that returns a kernel's plan for a call, or a ``str`` saying why it has none: for
    kernels whose decision costs what their body needs again (host reads, operand copies). The body gets the plan
    with ``.result(*call)``: the one ``takes`` made just before for the same argument objects (``choose`` asks
    ``takes`` right before running the body), else a fresh one. Kept per thread and handed out once; the next
    ``takes`` replaces it."""

    def __init__(self, plan: Callable[..., object]):
        self.plan = plan
        self._last = threading.local()

    def __call__(self, *call) -> Verdict:
        self._last.made = None
        result = self.plan(*call)
        if isinstance(result, str):
            return refuse(result)
        self._last.made = (call, result)
        return TAKEN

    def result(self, *call):
        made, self._last.made = getattr(self._last, "made", None), None
        if made is not None and len(made[0]) == len(call) and all(x is y for x, y in zip(made[0], call)):
            return made[1]
        result = self.plan(*call)
        if isinstance(result, str):
            raise RuntimeError(f"{self.plan.__name__}: the kernel ran on a call it refuses ({result})")
        return result


def first_refusal(*reasons: str | None) -> Verdict:
    """A kernel's verdict from its reasons to refuse (None where a condition holds): the first one, else taken."""
    reason = next((r for r in reasons if r), None)
    return TAKEN if reason is None else Verdict(False, reason)


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One entry of a chain: ``run`` computes the op (every schema argument, defaults filled), ``takes`` answers
    for a call (same arguments), ``available`` for the library (None: always there)."""

    op: str
    device: str
    library: str
    calls: str
    run: Callable | None
    takes: Callable[..., Verdict] = takes_all
    available: Callable[[], Verdict] | None = None

    @property
    def tier(self) -> str:
        return LIBRARIES[self.library]

    @property
    def label(self) -> str:
        root = self.library.partition(".")[0]
        return self.calls if self.calls.startswith(root) else f"{self.library}: {self.calls}"


_DECLARED: dict[tuple[str, str], list[Kernel]] = {}
_CHAINS: dict[tuple[str, str], list[Kernel]] = {}  # ``chain``'s answers on the devices (each call asks it)
_REGISTERED: set[tuple[str, str]] = set()
_LIB = torch.library.Library(_registry.NAMESPACE, "IMPL")  # the one dispatcher kernel per (op, device)


def kernel(
    name: str | Callable | None = None,
    *,
    device: str,
    library: str,
    calls: str,
    takes: Callable[..., Verdict] | None = None,
    available: Callable[[], Verdict] | None = None,
):
    """Declare ``fn`` a kernel of ``ascend_moe::<name>`` (default: the function's name) on ``device`` ("cuda",
    "npu"), from ``library`` (a key of ``LIBRARIES``), running ``calls`` (shown by ``info``). ``takes`` answers
    for a call (None: every call); ``available`` for the library. Both receive what the kernel receives: every
    schema argument. The kernel body validates what ``takes`` does not (our op's errors come first on every path).

    >>> @kernel(device="cuda", library="triton", calls="_scaled_gemm", takes=takes_scaled)  # doctest: +SKIP
    ... def fp8_gemm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype): ...
    """
    if device not in DEVICE_KEYS or device == "cpu":
        raise ValueError(f"chain.kernel: device must be 'cuda' or 'npu', got {device!r}")
    if library not in LIBRARIES or library in ("portable", "cpp"):
        raise ValueError(f"chain.kernel: library must be one of {sorted(set(LIBRARIES) - {'portable', 'cpp'})}")

    def declare(fn: Callable, op: str) -> None:
        checked = None if takes is None else _registry.with_defaults(op, takes)
        entry = Kernel(op, device, library, calls, fn, checked or takes_all, available)
        _DECLARED.setdefault((op, device), []).append(entry)
        _CHAINS.pop((op, device), None)
        if (op, device) not in _REGISTERED:
            _REGISTERED.add((op, device))
            _LIB.impl(op, runner(op, device), DEVICE_KEYS[device])

    return _registry._by_name(name, declare)


def runner(op: str, device: str) -> Callable:
    """What the dispatcher runs for ``op`` on ``device``: the chosen kernel."""

    def run_chosen(*call):  # not ``*args``: with_defaults would pass a kernel named ``args`` a namespace
        return choose(op, device, call).run(*call)

    run_chosen.__name__ = f"{op}_{device}_chain"
    return _registry.with_defaults(op, run_chosen)


def chain(op: str, device: str) -> list[Kernel]:
    """``op``'s kernels on ``device`` in the order ``choose`` asks them; the portable kernel last."""
    if device != "cpu" and (op, device) in _CHAINS:
        return _CHAINS[(op, device)]
    declared = sorted(_DECLARED.get((op, device), []), key=lambda k: TIERS.index(k.tier))
    if device == "cpu" and _has_cpp_kernel(op):
        declared.insert(0, Kernel(op, "cpu", "cpp", "C++ (csrc/ops)", None))
    portable = _registry.PORTABLE.get(op)
    kernels = declared + ([Kernel(op, device, "portable", "portable", portable)] if portable else [])
    if device != "cpu":
        _CHAINS[(op, device)] = kernels
    return kernels


_CPP: dict[str, bool] = {}


def _has_cpp_kernel(op: str) -> bool:
    """Whether ``op`` has a C++ CPU kernel, read from the dispatcher once per op (``on_cpu`` reads every op's before
    it puts Python kernels on the CPU key)."""
    if op not in _CPP:
        _CPP[op] = torch._C._dispatch_has_kernel_for_dispatch_key(f"{_registry.NAMESPACE}::{op}", "CPU")
    return _CPP[op]


def devices() -> list[str]:
    return list(DEVICE_KEYS)


_PORTABLE_WHY: dict[tuple[str, str], str] = {}


def stays_portable(*ops: str, device: str, why: str) -> None:
    """Declare that ``ops`` have no vendor kernel nor one of ours on ``device``, on purpose (an upstream library's
    kernel may still come first where installed), and ``why`` (one line: what the portable kernel runs there, or
    why the vendor's nearest op does not compute ours); ``info`` shows it beside the chain. The family's device
    module says the long why in its docstring.

    >>> stays_portable("rms_norm", device="npu", why="a row reduction and elementwise ACLNN ops")
    """
    if device not in DEVICE_KEYS or device == "cpu":
        raise ValueError(f"chain.stays_portable: device must be 'cuda' or 'npu', got {device!r}")
    unknown = sorted(set(ops) - set(_registry.op_names()))
    if unknown or not why:
        raise ValueError(f"chain.stays_portable: unknown ops {unknown} or an empty reason")
    for op in ops:
        _PORTABLE_WHY[(op, device)] = why


def portable_why(op: str, device: str) -> str | None:
    """Why ``op`` runs its portable kernel on ``device`` by design (``stays_portable``), or None."""
    return _PORTABLE_WHY.get((op, device))


def ops_with_kernels(device: str) -> list[str]:
    """The ops that have a declared kernel on ``device`` (every other op runs its portable kernel there)."""
    return sorted(op for op, d in _DECLARED if d == device)


# ----------------------------------------------------------------------------------------------------- switches

_BLOCKS: list[frozenset[str]] = []  # disabled(...) blocks, innermost last
_ENV_CACHE: list = [None, frozenset()]  # (raw value, parsed)


def _parse(names, source: str) -> frozenset[str]:
    known_ops = set(_registry.op_names())
    out = set()
    for raw in names:
        name = raw.strip()
        if not name:
            continue
        op, _, library = name.rpartition(":")
        if library not in LIBRARIES or (op and op not in known_ops):
            raise ValueError(
                f"{source}: cannot disable {name!r}: expected a library ({', '.join(sorted(LIBRARIES))}) or "
                "'<op>:<library>' with an ascend_moe op"
            )
        if library in ("portable", "cpp"):
            raise ValueError(f"{source}: cannot disable {name!r}: the portable and C++ kernels end every chain")
        out.add(name)
    return frozenset(out)


def disabled_names() -> frozenset[str]:
    """What is switched off now: ``TORCH_ASCEND_MOE_DISABLE`` plus every enclosing ``disabled(...)`` block."""
    raw = os.environ.get(ENV, "")
    if raw != _ENV_CACHE[0]:
        _ENV_CACHE[:] = [raw, _parse(raw.split(","), ENV)]
    names = _ENV_CACHE[1]
    for block in _BLOCKS:
        names = names | block
    return names


def is_disabled(k: Kernel, names: frozenset[str] | None = None) -> bool:
    names = disabled_names() if names is None else names
    whole = k.library.partition(".")[0]
    return any(lib in names or f"{k.op}:{lib}" in names for lib in {k.library, whole})


@contextlib.contextmanager
def disabled(*names: str) -> Iterator[None]:
    """Within the block, the named libraries (``"deep_gemm"``) or one op's kernel (``"fp8_gemm:triton"``) are
    skipped by every choice, as ``TORCH_ASCEND_MOE_DISABLE`` does for a whole process."""
    _BLOCKS.append(_parse(names, "chain.disabled"))
    try:
        yield
    finally:
        _BLOCKS.pop()


_REFRESHERS: list[Callable[[], None]] = []


def on_refresh(fn: Callable[[], None]) -> Callable[[], None]:
    """Register what ``refresh`` calls (each upstream library forgets whether it was found)."""
    _REFRESHERS.append(fn)
    return fn


def refresh() -> None:
    """Look for the upstream libraries again at the next choice (after one was installed or removed while this
    process runs)."""
    for fn in _REFRESHERS:
        fn()


# ------------------------------------------------------------------------------------------------------ choosing


_CHOICES: list[list] = []  # the open ``recording()`` blocks' lists


def choose(op: str, device: str, args: tuple) -> Kernel:
    """The first kernel of ``op``'s chain on ``device`` that is enabled, available and takes ``args`` (every schema
    argument). A kernel's ``takes`` may raise the op's own validation error: that is the call's answer."""
    names = disabled_names()
    for k in chain(op, device):
        if k.run is None or is_disabled(k, names):
            continue
        if k.available is not None and not k.available().ok:
            continue
        if k.takes(*args).ok:
            for choices in _CHOICES:
                choices.append(k)
            return k
    raise RuntimeError(f"ascend_moe::{op}: no kernel on {device} takes this call (the chain has no portable kernel)")


class Step(NamedTuple):
    """One line of ``explain``: the kernel, what happened ("chosen", "refused", "not available", "disabled",
    "not asked") and why."""

    kernel: Kernel
    status: str
    reason: str


def explain(op: str, device: str, *args, **kwargs) -> list[Step]:
    """Why ``op(*args)`` on ``device`` runs the kernel it runs: every entry of the chain with its answer.

    >>> for step in explain("fp8_gemm", "cuda", a, sfa, b, sfb):  # doctest: +SKIP
    ...     print(step.kernel.label, step.status, step.reason)
    """
    full = _registry.full_call(op, *args, **kwargs)
    names = disabled_names()
    steps, chosen = [], False
    for k in chain(op, device):
        if chosen:
            steps.append(Step(k, "not asked", "an earlier kernel took the call"))
            continue
        if k.run is None:  # the C++ CPU kernel: the dispatcher's own
            steps.append(Step(k, "chosen", "the dispatcher's CPU kernel takes every CPU call"))
            chosen = True
            continue
        if is_disabled(k, names):
            steps.append(Step(k, "disabled", f"switched off ({ENV} or chain.disabled)"))
            continue
        if k.available is not None:
            there = k.available()
            if not there.ok:
                steps.append(Step(k, "not available", there.reason))
                continue
        verdict = k.takes(*full)
        steps.append(Step(k, "chosen" if verdict.ok else "refused", verdict.reason))
        chosen = verdict.ok
    return steps


@contextlib.contextmanager
def recording() -> Iterator[list[Kernel]]:
    """The kernels chosen within the block, in call order (device chains only: the C++ CPU kernels are the
    dispatcher's)."""
    choices: list[Kernel] = []
    _CHOICES.append(choices)
    try:
        yield choices
    finally:
        _CHOICES.remove(choices)


def warmup(fn: Callable, *args, **kwargs) -> list[Kernel]:
    """Run ``fn(*args, **kwargs)`` once so that every kernel its calls choose is ready, and return those kernels.

    DeepGEMM and DeepGEMM-Ascend compile each kernel on its first call (JIT: seconds, and a host sync), which a CUDA
    graph or aclgraph capture must not see: call this with the shapes the capture will use, then capture. Triton
    kernels compile on first launch too, and DeepEP builds its buffers (a collective) on the first call that needs
    them. Gradients are not tracked; the device is synchronized afterwards.

    >>> kernels = torch_ascend_moe.warmup(model, tokens)  # doctest: +SKIP
    >>> graph = torch.cuda.CUDAGraph()  # doctest: +SKIP
    """
    with recording() as choices, torch.no_grad():
        fn(*args, **kwargs)
    for device in {k.device for k in choices}:
        backend = getattr(torch, device, None)
        if backend is not None and hasattr(backend, "synchronize") and backend.is_available():
            backend.synchronize()
    return choices


def run(op: str, device: str, *args, **kwargs):
    """``op`` computed by the kernel ``choose`` picks on ``device``'s chain, whatever the tensors' device (tests
    run CUDA and NPU chains on CPU tensors this way)."""
    return runner(op, device)(*args, **kwargs)


def runners(device: str) -> types.SimpleNamespace:
    """Every op with kernels on ``device`` as a function that runs that device's chain whatever the tensors'
    device (``run``), by op name: ``runners("cuda").fp8_gemm(a, sfa, b, sfb)``."""
    return types.SimpleNamespace(**{op: runner(op, device) for op in ops_with_kernels(device)})


@contextlib.contextmanager
def on_cpu(device: str) -> Iterator[None]:
    """Within the block, CPU tensors run every op through ``device``'s chain, as ``device`` tensors would (the C++
    CPU kernels set aside: an op with no kernel of its own there runs its portable kernel, as on the device): how CI
    exercises the CUDA chains (Triton interpreted) and the NPU chains (torch_npu's ops emulated) through the
    dispatcher, in eager, compiled and exported code."""
    lib = torch.library.Library(_registry.NAMESPACE, "IMPL")
    saved = _registry._CPU_STANDS_FOR[0]
    try:
        with _quiet_override():
            for op in sorted(set(ops_with_kernels(device)) | set(_registry.PORTABLE)):
                _has_cpp_kernel(op)
                lib.impl(op, runner(op, device), "CPU")
        _registry._CPU_STANDS_FOR[0] = device
        yield
    finally:
        _registry._CPU_STANDS_FOR[0] = saved
        lib._destroy()


@contextlib.contextmanager
def _quiet_override() -> Iterator[None]:
    """torch warns once per kernel it overrides; here the override is the point (``_destroy`` restores it)."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="(?s).*Overriding a previously registered kernel")
        yield
