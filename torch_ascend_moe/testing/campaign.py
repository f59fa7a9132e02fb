"""A bad-input campaign over ops: one argument of a valid sample is mutated at a time.

For each mutated call the eager kernel, the portable kernel and the fake must reach the same verdict: all
accept it (with the same output dtypes and shapes), or all reject it with the SAME whole message
(``<op>: argument '<arg>' ...``). A kernel may reject a call its fake accepts only for a check of tensor *values*
(ids, offsets, lengths), which a fake cannot see. A request for more memory than the machine has may fail with
the allocator's error. Anything else is a defect: an error of another kind (an overflow in size arithmetic, an
internal assert, an index error) or a crash.

Mutations: every other dtype, one dim more or fewer, each dim one shorter or longer, a non-contiguous copy of a
tensor; int64 edge values for every integer (and each entry of an integer list), plus random ones drawn by
hypothesis; NaN, infinities and signs for floats.

Run the specs of one module (any importable module listing ``SPECS``, e.g. ``tests.gemm.specs`` with the
repository root on ``sys.path``, or a third-party backend's own) in a subprocess with a memory cap
(``python -m torch_ascend_moe.testing.campaign MODULE``), so an accepted huge size cannot exhaust the machine;
it prints one JSON line of findings.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import resource
import sys
from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torch_ascend_moe.testing.harness import OpSpec

# Integer edge values: the ends of int64, the ends of int32, around 2**62 (where `x + a - 1` wraps), signs.
EDGE_INTS = (-(2**63), -(2**62) - 1, -1, 0, 2**31, 2**62 + 1, 2**63 - 1)
DTYPES = (
    torch.float64,
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.int64,
    torch.int32,
    torch.uint8,
    torch.bool,
    torch.float8_e4m3fn,
    torch.float8_e8m0fnu,
)
ALLOCATION_FAILURE = ("can't allocate memory", "DefaultCPUAllocator")
MEMORY_CAP_BYTES = 6 << 30


def _to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype) if x.is_floating_point() or not dtype.is_floating_point else x.float().to(dtype)


def tensor_mutations(x: torch.Tensor) -> list[tuple[str, Callable[[], torch.Tensor]]]:
    out = [(f"dtype {d}", lambda d=d: _to(x, d)) for d in DTYPES if d != x.dtype]
    out.append(("one dim more", lambda: x.unsqueeze(0)))
    if x.dim() > 0:
        out.append(("one dim fewer", lambda: x.select(0, 0) if x.size(0) else x.sum(0).to(x.dtype)))
        for d in range(x.dim()):
            if x.size(d) > 1:
                out.append((f"dim {d} one shorter", lambda d=d: x.narrow(d, 0, x.size(d) - 1)))
            out.append((f"dim {d} one longer", lambda d=d: torch.cat([x, x.narrow(d, 0, min(1, x.size(d)))], d)))
    if x.dim() >= 2:
        out.append(("non-contiguous", lambda: x.transpose(-1, -2).contiguous().transpose(-1, -2)))
    if x.numel() and x.dtype in (torch.int32, torch.int64):
        # Data the kernels must check (ids, offsets, lengths); a fake cannot see them.
        top = torch.iinfo(x.dtype).max
        for v in dict.fromkeys((-2, -1, top, min(x.max().item() + 1, top))):  # max + 1 saturates (int32 entries)
            out.append(
                (f"entry 0 = {v}", lambda v=v: x.flatten().clone().index_fill_(0, torch.tensor([0]), v).view(x.shape))
            )
    if x.numel() and x.is_floating_point() and x.element_size() > 1:
        out.append(("one NaN", lambda: x.flatten().clone().index_fill_(0, torch.tensor([0]), math.nan).view(x.shape)))
    return out


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int_list(x) -> bool:
    return isinstance(x, (list, tuple)) and all(_is_int(v) for v in x)


def value_mutations(x, ints=EDGE_INTS) -> list[tuple[str, Callable[[], object]]]:
    """Mutations of a non-tensor argument; ``ints`` are the integers tried for an int or a list entry."""
    if _is_int(x):
        return [(f"int {v}", lambda v=v: v) for v in ints if v != x]
    if isinstance(x, float):
        return [(f"float {v}", lambda v=v: v) for v in (math.nan, math.inf, -math.inf, -1.0, 0.0) if v != x]
    if _int_list(x):
        out = []
        for i in range(len(x)):
            out += [(f"[{i}] = {v}", lambda i=i, v=v: [*x[:i], v, *x[i + 1 :]]) for v in ints if v != x[i]]
        out.append(("one more entry", lambda: [*x, 1]))
        if x:
            out.append(("one entry fewer", lambda: list(x[:-1])))
        return out
    return []


def mutations(x) -> list[tuple[str, Callable[[], object]]]:
    return tensor_mutations(x) if isinstance(x, torch.Tensor) else value_mutations(x)


def _outcome(fn):
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001  (the verdict below judges every kind)
        return None, e


def _fake_call(op, args):
    # A shape environment lets a fake with data-dependent output sizes (unbacked symbols) answer; inputs stay
    # static, so every other fake sees what it always saw.
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv()) as mode:
        return op(*(mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x for x in args))


def _is_argument_error(e: BaseException) -> bool:
    return isinstance(e, ValueError) and str(e).startswith("ascend_moe::")


def _is_schema_error(e: BaseException) -> bool:
    """The dispatcher's own type check (a list where an int belongs): the same on every path."""
    return isinstance(e, TypeError) or "Expected a value of type" in str(e) or "Overflow when unpacking" in str(e)


def _is_allocation_failure(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or (isinstance(e, RuntimeError) and any(s in str(e) for s in ALLOCATION_FAILURE))


def _outputs(x) -> list:
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _same_meta(eager, fake) -> bool:
    e, f = _outputs(eager), _outputs(fake)
    return len(e) == len(f) and all(
        # A symbolic (data-dependent) size matches any; asked first, so comparing never guards on it.
        x.dtype == y.dtype and (not all(isinstance(s, int) for s in y.shape) or tuple(x.shape) == tuple(y.shape))
        for x, y in zip(e, f)
    )


def _compare(eager, portable) -> str | None:
    """Outputs of two kernels agree: integers exactly, floats to 1% of their scale, NaN where NaN."""
    for k, (x, y) in enumerate(zip(_outputs(eager), _outputs(portable))):
        if x.dtype != y.dtype or x.shape != y.shape:
            return f"output {k} differs in dtype or shape: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
        if not x.is_floating_point():
            if not torch.equal(x, y):
                return f"integer output {k} differs"
            continue
        x, y = x.double(), y.double()
        if not torch.equal(x.isnan(), y.isnan()):
            return f"output {k} has NaN in different places"
        finite = x.isfinite() & y.isfinite()
        if not torch.equal(x[~finite].nan_to_num(), y[~finite].nan_to_num()):
            return f"output {k} has different infinities"
        scale = max(x[finite].abs().max().item() if finite.any() else 0.0, 1.0)
        if finite.any() and (x[finite] - y[finite]).abs().max().item() > 1e-2 * scale:
            return f"output {k} differs by {(x[finite] - y[finite]).abs().max().item():.3g} (scale {scale:.3g})"
    return None


def verdict(spec: OpSpec, args: tuple) -> str | None:
    """None when every path agrees on ``args``; else what differs."""
    eager, e_err = _outcome(lambda: spec.op(*args))
    if e_err is not None:
        if _is_schema_error(e_err) or _is_allocation_failure(e_err):
            return None
        if not _is_argument_error(e_err):
            return f"eager raised {type(e_err).__name__}, not an argument error: {e_err}"
    text = None if e_err is None else str(e_err)
    if spec.portable is not None:
        portable, p_err = _outcome(lambda: spec.portable(*args))
        if p_err is not None and _is_allocation_failure(p_err):
            pass
        elif text is None and p_err is not None:
            return f"eager accepts, portable raises {type(p_err).__name__}: {p_err}"
        elif text is not None and (p_err is None or str(p_err) != text):
            return f"portable disagrees with eager\n  eager:    {text}\n  portable: {p_err}"
    # A non-finite scalar (alpha = inf) meets exact zeros in an order each kernel may choose: inf·0 is NaN in one,
    # 0 in another. Only the verdict is compared then.
    finite_scalars = all(math.isfinite(x) for x in args if isinstance(x, float))
    if text is None and spec.portable is not None and p_err is None and finite_scalars:
        problem = _compare(eager, portable)
        if problem:
            return f"eager and portable both accept, but {problem}"
    fake, f_err = _outcome(lambda: _fake_call(spec.op, args))
    if f_err is not None:
        if text is None or str(f_err) != text:
            return f"fake disagrees with eager\n  eager: {text}\n  fake:  {type(f_err).__name__}: {f_err}"
    elif text is None and not _same_meta(eager, fake):
        return "fake outputs differ from eager's in dtype or shape"
    return None


def kernel_problems(spec: OpSpec, kernel, samples) -> tuple[list[str], int]:
    """Every mutation of every argument of ``samples``, with ``kernel`` (a device backend's, say) in the portable
    kernel's place: (what disagrees with the C++ kernel, how many calls were checked)."""
    checked = dataclasses.replace(spec, portable=kernel)
    problems, count = [], 0
    for sample in samples:
        for i, x in enumerate(sample.args):
            for name, mutate in mutations(x):
                count += 1
                problem = verdict(checked, _mutated(sample, i, mutate()))
                if problem:
                    problems.append(f"{sample.name} arg {i} {name}: {problem}")
    return problems, count


def cases(specs: list[OpSpec], samples_per_op: int = 2):
    """(spec, sample, argument index, mutation name, mutate) for every mutation of every sample argument."""
    for spec in specs:
        for sample in spec.sample_inputs("cpu", torch.float32, small=True)[:samples_per_op]:
            for i, x in enumerate(sample.args):
                for name, mutate in mutations(x):
                    yield spec, sample, i, name, mutate


def _mutated(sample, i, value) -> tuple:
    args = list(sample.args)
    args[i] = value
    return tuple(args)


def run_specs(module: str, random_examples: int = 60) -> dict:
    """Every fixed mutation of the ops in ``module``'s ``SPECS`` (a module name), then ``random_examples``
    hypothesis-drawn integers."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    specs = [s for s in importlib.import_module(module).SPECS if s.devices is None or "cpu" in s.devices]
    findings, count = [], 0
    for spec, sample, i, name, mutate in cases(specs):
        count += 1
        problem = verdict(spec, _mutated(sample, i, mutate()))
        if problem:
            findings.append(f"{spec.name}[{sample.name}] argument {i} ({name}): {problem}")

    int_args = [
        (spec, sample, i)
        for spec in specs
        for sample in spec.sample_inputs("cpu", torch.float32, small=True)[:1]
        for i, x in enumerate(sample.args)
        if _is_int(x) or (_int_list(x) and x)
    ]
    if int_args:

        @settings(
            max_examples=random_examples,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(st.sampled_from(int_args), st.integers(-(2**63), 2**63 - 1), st.integers(0, 7))
        def random_ints(target, value, entry):
            spec, sample, i = target
            x = sample.args[i]
            new = value if _is_int(x) else [*x[: entry % len(x)], value, *x[entry % len(x) + 1 :]]
            problem = verdict(spec, _mutated(sample, i, new))
            if problem:
                findings.append(f"{spec.name}[{sample.name}] argument {i} (random {new}): {problem}")

        random_ints()
    return {"specs": module, "cases": count, "findings": findings}


if __name__ == "__main__":
    # Cap the address space: an accepted huge size then fails to allocate instead of exhausting the machine.
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP_BYTES, MEMORY_CAP_BYTES))
    import torch_ascend_moe  # noqa: F401  (registers the ops)

    print(json.dumps(run_specs(sys.argv[1])))
