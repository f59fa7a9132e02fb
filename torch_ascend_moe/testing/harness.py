"""The op-contract harness: one ``OpSpec`` per op, checked the same way for every family.

A family's specs live in ``tests/<family>/specs.py`` (``SPECS``); its contract test module binds
``test_op_contract = contract_test(SPECS)``, which parametrizes over ``CHECKS``. A third-party backend runs the
same checks on its device with these specs or its own. Each check takes ``(spec, device, tmp_path)`` and raises
``AssertionError`` with a useful message on failure:

    numerics     every sample vs the fp64 reference (DeepGEMM's calc_diff and thresholds; non-finite entries,
                 e.g. masked -inf logits, exactly equal), C++ and portable
    opcheck      torch.library.opcheck, all four test utils, with and without requires_grad (test_schema
                 done bitwise for FP8 inputs, which SchemaCheckMode's allclose cannot compare)
    gradcheck    float64 gradcheck of every differentiable input
    compile      torch.compile(fullgraph=True, dynamic=True) forward+backward parity, one graph, op in it
    export       torch.export (dynamic dims) + save, then load and run in a fresh subprocess
    aoti         AOTInductor package, loaded in a fresh subprocess with only the C++ library (slow)

export and aoti run once per family: every op of the family, each called with its first sample, in one module
(``FamilyModule``), one exported program and one AOTInductor package (building a package costs ~20 s here,
almost all of it compiling the AOTI runtime, whatever the graph holds); a failure names the op.
    bad_inputs   each bad call raises the same error text in eager, in the fake, under compile, portably
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
import textwrap
import unittest
from collections.abc import Callable
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from torch_ascend_moe._registry import with_defaults
from torch_ascend_moe.testing import calc_diff

# calc_diff bounds per operand dtype: DeepGEMM's BF16 threshold; FP32/FP64 accumulate far tighter.
THRESHOLDS = {torch.bfloat16: 1e-5, torch.float16: 1e-5, torch.float32: 1e-10, torch.float64: 1e-20}
# Ops whose CUDA kernel multiplies FP8 on tensor cores: Hopper's FP8 MMA adds an instruction's products with
# reduced precision (DeepGEMM's reason to promote its sums to FP32 registers every 128 of K; our Triton kernel adds
# each K chunk's dot into an FP32 accumulator the same way). Measured on an H200: FP32 results at calc_diff 4e-9 to
# 1e-8 (the C++ kernel's exact FP32 sums: < 1e-10).
FP8_TENSOR_CORES = {"cuda": {torch.float32: 1e-7}}


@dataclasses.dataclass
class SampleInput:
    """Positional arguments of one op call, exactly as the schema orders them."""

    args: tuple
    name: str = ""


@dataclasses.dataclass
class BadInput:
    """A call that must fail with ``error`` whose text matches ``match`` on every path."""

    args: tuple
    match: str
    name: str
    error: type[Exception] = ValueError
    # A check of tensor *values* (layout offsets, ids): a fake cannot see them, so only the kernels (eager,
    # and the compiled graph when it runs them) raise it.
    data_dependent: bool = False


@dataclasses.dataclass
class OpSpec:
    """Everything the harness needs to check one op.

    ``sample_inputs(device, dtype, requires_grad=False, small=False)`` yields ``SampleInput``s; ``small``
    ones keep gradcheck and opcheck fast. ``reference`` computes in fp64 and receives every schema argument,
    in the schema's order (a sample that omits trailing arguments gets the schema's defaults filled in, so a
    reference states no default of its own).
    ``portable`` is the device-generic kernel that CUDA/NPU register (checked on CPU here), called with
    each of ``portable_variants`` as extra keyword arguments.
    """

    name: str
    sample_inputs: Callable[..., list[SampleInput]]
    reference: Callable[..., torch.Tensor]
    bad_inputs: Callable[[str], list[BadInput]]
    portable: Callable[..., torch.Tensor] | None = None
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float32)
    gradcheck: bool | str = True  # a string: why the op has no float64 gradcheck (the test is skipped)
    portable_variants: tuple[dict, ...] = ({},)
    aoti: bool | str = True  # a string: why the op cannot run in an AOTInductor package (the test is skipped)
    fresh_setup: str = ""  # code a fresh process runs before loading an exported program (e.g. a process group)
    devices: tuple[str, ...] | None = None  # the devices the spec runs on (None: every device the harness has)
    # Looser calc_diff bounds where a device's hardware computes less exactly: {device type: {dtype: bound}}.
    device_thresholds: dict = dataclasses.field(default_factory=dict)

    def threshold(self, device: str, dtype: torch.dtype) -> float:
        return self.device_thresholds.get(torch.device(device).type, {}).get(dtype, THRESHOLDS[dtype])

    @property
    def op(self) -> torch._ops.OpOverload:
        return getattr(torch.ops.ascend_moe, self.name).default

    def __str__(self) -> str:
        return self.name


class OpModule(torch.nn.Module):
    """Calls the op with a sample's non-tensor arguments baked in and its tensors as inputs."""

    def __init__(self, op, args: tuple):
        super().__init__()
        self.op = op
        self.positions = [i for i, x in enumerate(args) if isinstance(x, torch.Tensor)]
        self.template = [None if isinstance(x, torch.Tensor) else x for x in args]

    def forward(self, *tensors):
        args = list(self.template)
        for i, t in zip(self.positions, tensors):
            args[i] = t
        return self.op(*args)

    def tensors(self, args: tuple) -> tuple[torch.Tensor, ...]:
        return tuple(args[i] for i in self.positions)


def check_numerics(spec: OpSpec, device: str, tmp_path: Path | None = None) -> None:
    reference = with_defaults(spec.name, spec.reference)  # every schema argument, omitted defaults filled
    for dtype in spec.dtypes:
        for s in spec.sample_inputs(device, dtype):
            ref = reference(*(_on("cpu", x) for x in s.args))  # references compute in fp64 on the CPU
            fake_shape = None
            # A shape environment lets ops with data-dependent output sizes (unbacked SymInts) run as fakes.
            with FakeTensorMode(shape_env=ShapeEnv()) as mode:
                fake_args = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in s.args)
                fake_shape = spec.op(*fake_args)
            kernels = {"kernel": spec.op}
            for variant in spec.portable_variants if spec.portable is not None else ():
                kernels[f"portable {variant}"] = lambda *a, variant=variant: spec.portable(*a, **variant)
            for kind, fn in kernels.items():
                outs = tuple(o.cpu() for o in _as_tuple(fn(*s.args)))
                for i, (out, r, fake) in enumerate(zip(outs, _as_tuple(ref), _as_tuple(fake_shape), strict=True)):
                    where = f"{spec.name}[{s.name}, {dtype}] {kind} output {i}"
                    assert out.shape == r.shape, f"{where}: shape {list(out.shape)} != {list(r.shape)}"
                    assert _same_sizes(out.shape, fake.shape) and out.dtype == fake.dtype, f"{where}: fake disagrees"
                    assert _same_sizes(out.stride(), fake.stride()), f"{where}: strides {out.stride()} != fake's"
                    if out.dtype in _NO_ALLCLOSE:  # FP8 outputs (moved rows) compare by value in FP32
                        out = out.float()
                    if out.is_floating_point():
                        # Masked entries (-inf) must sit exactly where the reference has them.
                        finite = torch.isfinite(r)
                        same = torch.equal(torch.isfinite(out), finite) and torch.equal(
                            out[~finite], r[~finite].to(out)
                        )
                        assert same, f"{where}: non-finite entries differ from the reference's"
                        diff, bound = calc_diff(out[finite], r[finite]), spec.threshold(device, dtype)
                        assert diff < bound, f"{where}: calc_diff {diff:.3g} >= {bound:g}"
                    else:  # index outputs are exact
                        assert torch.equal(out, r.to(out.dtype)), f"{where}: {out.tolist()} != {r.tolist()}"


_OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
# SchemaCheckMode compares inputs with torch.allclose, which has no CPU kernel for these dtypes.
_NO_ALLCLOSE = (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu)


def _on(device: str, x):
    """A tensor argument moved between the CPU and the device under test (``device``); meta tensors (a bad
    input's wrong device) and non-tensors are kept."""
    if isinstance(x, torch.Tensor) and x.device.type not in (device, "meta"):
        if x.is_contiguous() or 0 in x.stride():  # (a broadcast view cannot be copied into in place)
            return x.detach().to(device).requires_grad_(x.requires_grad)
        # Strides kept, gaps too (``to`` makes a view that is not dense contiguous: a sample's row stride, or a
        # bad input's wrong one, would be lost on the device).
        y = torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device=device).copy_(x.detach())
        return y.requires_grad_(x.requires_grad)
    return x


def _same_sizes(concrete, fake) -> bool:
    """Sizes or strides agree; a data-dependent (unbacked, symbolic) fake entry matches any value."""
    return len(concrete) == len(fake) and all(isinstance(f, torch.SymInt) or c == f for c, f in zip(concrete, fake))


def _as_tuple(x) -> tuple:
    """An op's outputs as a tuple (ops return one tensor or several)."""
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.uint8).clone()


def _check_schema_bitwise(spec: OpSpec, args: tuple) -> None:
    """What opcheck's test_schema checks, done bitwise: no input is mutated, the output aliases none."""
    tensors = [x for x in args if isinstance(x, torch.Tensor)]
    before = [(_bytes(t), t.stride()) for t in tensors]
    out = spec.op(*args)
    for t, (data, stride) in zip(tensors, before):
        assert t.stride() == stride and torch.equal(_bytes(t), data), f"{spec.name}: an input was mutated"
        for o in _as_tuple(out):
            assert not torch._C._is_alias_of(o, t), f"{spec.name}: an output aliases an input"


def check_opcheck(spec: OpSpec, device: str, tmp_path: Path | None = None) -> None:
    for dtype in spec.dtypes:
        for requires_grad in (False, True):
            for s in spec.sample_inputs(device, dtype, requires_grad=requires_grad, small=True):
                utils = _OPCHECK_UTILS
                if any(isinstance(x, torch.Tensor) and x.dtype in _NO_ALLCLOSE for x in s.args):
                    utils = utils[1:]
                    _check_schema_bitwise(spec, s.args)
                torch.library.opcheck(spec.op, s.args, test_utils=utils)


def _grad_inputs(args: tuple) -> list[int]:
    return [i for i, x in enumerate(args) if isinstance(x, torch.Tensor) and x.requires_grad]


def check_gradcheck(spec: OpSpec, device: str, tmp_path: Path | None = None) -> None:
    if spec.gradcheck is not True:
        raise unittest.SkipTest(f"{spec.name}: {spec.gradcheck or 'no float64 path to gradcheck'}")
    for s in spec.sample_inputs(device, torch.float64, requires_grad=True, small=True):
        positions = _grad_inputs(s.args)

        def fn(*tensors, s=s, positions=positions):
            args = list(s.args)
            for i, t in zip(positions, tensors):
                args[i] = t
            # Floating outputs only: gradcheck misaligns its Jacobians when integer outputs sit between them.
            floats = tuple(o for o in _as_tuple(spec.op(*args)) if o.is_floating_point())
            return floats[0] if len(floats) == 1 else floats

        assert torch.autograd.gradcheck(fn, tuple(s.args[i] for i in positions)), f"{spec.name}[{s.name}]"


def check_compile(spec: OpSpec, device: str, tmp_path: Path | None = None) -> None:
    from torch._dynamo.testing import CompileCounterWithBackend

    # FP32 samples also check the compiled backward; reduced-precision ones the forward. Three samples in FP32 (else
    # the op's first dtype), one in each other dtype: the compiled call is the same opaque op whatever the dtype, and
    # the fake's dtype rules are checked on every sample by check_numerics.
    full = torch.float32 if torch.float32 in spec.dtypes else spec.dtypes[0]
    for dtype in spec.dtypes:
        requires_grad = dtype == torch.float32
        count = 3 if dtype == full else 1
        for s in spec.sample_inputs(device, dtype, requires_grad=requires_grad, small=True)[:count]:
            torch._dynamo.reset()
            module = OpModule(spec.op, s.args)
            counter = CompileCounterWithBackend("inductor")
            compiled = torch.compile(module, fullgraph=True, dynamic=True, backend=counter)
            tensors = module.tensors(s.args)
            eager, out = module(*tensors), compiled(*tensors)
            where = f"{spec.name}[{s.name}, {dtype}] compiled"
            torch.testing.assert_close(out, eager, rtol=0, atol=0, msg=lambda m, where=where: f"{where}: {m}")
            graphs = [g for g in counter.graphs if f"ascend_moe.{spec.name}" in g.code]
            assert len(graphs) == 1, f"{where}: the op is in {len(graphs)} graphs, expected 1"
            inputs = [t for t in tensors if t.requires_grad]
            eager_outs = [o for o in _as_tuple(eager) if o.requires_grad]
            compiled_outs = [o for o in _as_tuple(out) if o.requires_grad]
            if inputs and eager_outs and all(o.numel() for o in eager_outs):
                grads = [torch.randn_like(o) for o in eager_outs]
                expected = torch.autograd.grad(eager_outs, inputs, grads, allow_unused=True)
                got = torch.autograd.grad(compiled_outs, inputs, grads, allow_unused=True)
                for e, g in zip(expected, got):
                    assert (e is None) == (g is None), f"{where} backward: gradient presence differs"
                    if e is None:
                        continue
                    # Compiled backward formulas (block sums, ...) may reduce in another order than eager: FP32
                    # gets the summation error bound of the reductions here (~n·eps, n = 128); the others have
                    # not needed more than 1e-6.
                    tol = _GRAD_TOL.get(e.dtype, 1e-6)
                    torch.testing.assert_close(
                        g, e, rtol=tol, atol=tol, msg=lambda m, where=where: f"{where} backward: {m}"
                    )


_GRAD_TOL = {torch.float32: 1e-5}


class FamilyModule(torch.nn.Module):
    """Every op of a family, each called with one sample's tensors (in order) as inputs; returns their outputs."""

    def __init__(self, modules: list[OpModule], counts: list[int]):
        super().__init__()
        self.ops = torch.nn.ModuleList(modules)
        self.counts = counts

    def forward(self, *tensors):
        outs, start = [], 0
        for module, n in zip(self.ops, self.counts):
            outs.append(module(*tensors[start : start + n]))
            start += n
        return tuple(outs)


def _export_module(module: torch.nn.Module, tensors: tuple):
    dims = tuple({d: torch.export.Dim.AUTO for d in range(t.dim())} for t in tensors)
    return torch.export.export(module, tensors, dynamic_shapes=(dims,))  # one spec per *tensors entry


def _export(specs: list[OpSpec], device: str):
    """The family's ops in one exported program (dynamic dims): ``(program, inputs, per-op outputs)``."""
    modules, groups = [], []
    for spec in specs:
        args = spec.sample_inputs(device, torch.float32, small=True)[0].args
        modules.append(OpModule(spec.op, args))
        groups.append(modules[-1].tensors(args))
    family = FamilyModule(modules, [len(g) for g in groups])
    tensors = tuple(t for g in groups for t in g)
    try:
        ep = _export_module(family, tensors)
    except Exception:
        for spec, module, group in zip(specs, modules, groups):  # name the op that cannot be exported
            try:
                _export_module(module, group)
            except Exception as e:
                raise AssertionError(f"{spec.name}: torch.export failed: {e}") from e
        raise
    graph = str(ep.graph)
    for spec in specs:
        assert f"ascend_moe.{spec.name}" in graph, f"{spec.name}: op not in the exported graph"
    return ep, tensors, family(*tensors)


def _run_fresh(script: str, *argv: str, setup: str = "") -> None:
    code = textwrap.dedent(setup) + textwrap.dedent(script)
    result = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0 and "ROUNDTRIP OK" in result.stdout, (
        f"fresh process failed (rc={result.returncode}):\n{result.stdout}\n{result.stderr}"
    )


# The fresh process compares each op's outputs (flattened) with what the exporting process computed.
_COMPARE = """
from torch.utils._pytree import tree_leaves
got, start = tree_leaves(outputs), 0
for name, expected in zip(data["names"], data["expected"]):
    torch.testing.assert_close(
        got[start : start + len(expected)], expected, rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}"
    )
    start += len(expected)
assert start == len(got), f"{len(got)} outputs, expected {start}"
print("ROUNDTRIP OK")
"""


def _save_data(specs, tensors, outputs, path: Path) -> None:
    from torch.utils._pytree import tree_leaves

    expected = [tree_leaves(out) for out in outputs]
    torch.save({"inputs": tensors, "expected": expected, "names": [s.name for s in specs]}, path)


def _fresh_setup(specs: list[OpSpec]) -> str:
    setups = {spec.fresh_setup for spec in specs if spec.fresh_setup}
    assert len(setups) <= 1, "a family's specs must agree on fresh_setup (they are exported together)"
    return setups.pop() if setups else ""


def check_export(specs: list[OpSpec], device: str, tmp_path: Path) -> None:
    ep, tensors, outputs = _export(specs, device)
    program, data = tmp_path / "family.pt2", tmp_path / "family.data"
    torch.export.save(ep, program)
    _save_data(specs, tensors, outputs, data)
    _run_fresh(
        textwrap.dedent(
            """
        import sys, torch, torch_ascend_moe
        ep = torch.export.load(sys.argv[1])
        data = torch.load(sys.argv[2])
        outputs = ep.module()(*data["inputs"])
        """
        )
        + _COMPARE,
        str(program),
        str(data),
        setup=_fresh_setup(specs),
    )


def check_aoti(specs: list[OpSpec], device: str, tmp_path: Path) -> None:
    import torch_ascend_moe

    specs = [spec for spec in specs if spec.aoti is True]
    if not specs:
        raise unittest.SkipTest("no op of this family can run in an AOTInductor package")
    ep, tensors, outputs = _export(specs, device)
    package = torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp_path / "family_aoti.pt2"))
    data = tmp_path / "family_aoti.data"
    _save_data(specs, tensors, outputs, data)
    # Only the C++ library is loaded: a deployment needs no Python fakes or autograd.
    _run_fresh(
        textwrap.dedent(
            """
        import sys, torch
        torch.ops.load_library(sys.argv[3])
        runner = torch._inductor.aoti_load_package(sys.argv[1])
        data = torch.load(sys.argv[2])
        outputs = runner(*data["inputs"])
        """
        )
        + _COMPARE,
        package,
        str(data),
        torch_ascend_moe._C.__file__,
    )


def skip_aoti(spec: OpSpec, device: str, tmp_path: Path) -> None:
    """The per-op entry of an op that cannot be in a package: its reason, as a skip."""
    raise unittest.SkipTest(f"{spec.name}: {spec.aoti}")


def check_bad_inputs(spec: OpSpec, device: str, tmp_path: Path | None = None) -> None:
    for bad in spec.bad_inputs(device):
        if device != "cpu":  # bad inputs are written on the CPU; run them on the device under test
            bad = dataclasses.replace(bad, args=tuple(_on(device, x) for x in bad.args))
        _check_bad_input(spec, bad)


def _error_of(fn: Callable[[], object], error: type[Exception] | None, where: str) -> Exception:
    """The exception ``fn`` raises (of type ``error`` when given)."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the type is checked below)
        if error is not None and not isinstance(e, error):
            raise AssertionError(f"{where}: expected {error.__name__}, got {type(e).__name__}: {e}") from e
        return e
    raise AssertionError(f"{where}: expected an error, got none")


def _chain(e: BaseException):
    """``e`` and the exceptions it was raised from (Dynamo wraps a fake's error in its own)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _expect_same_error(fn: Callable[[], object], error: type[Exception] | None, text: str, where: str) -> None:
    """``fn`` fails with exactly ``text`` (the eager message), itself or as the error a wrapper was raised from."""
    e = _error_of(fn, error, where)
    if not any(str(x) == text for x in _chain(e)):
        raise AssertionError(f"{where}: error text differs from eager's\n  eager: {text}\n  here:  {e}") from e


def _check_bad_input(spec: OpSpec, bad: BadInput) -> None:
    """The eager error matches ``bad.match``; portable, fake and compiled paths raise the SAME whole message."""
    where = f"{spec.name}[{bad.name}]"
    eager = _error_of(lambda: spec.op(*bad.args), bad.error, f"{where} eager")
    text = str(eager)
    if not re.search(bad.match, text):
        raise AssertionError(f"{where} eager: error text does not match {bad.match!r}: {text}") from eager
    if spec.portable is not None:
        _expect_same_error(lambda: spec.portable(*bad.args), bad.error, text, f"{where} portable")

    def fake_call():
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            spec.op(*(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in bad.args))

    if not bad.data_dependent:
        _expect_same_error(fake_call, bad.error, text, f"{where} fake")
    torch._dynamo.reset()
    module = OpModule(spec.op, bad.args)
    compiled = torch.compile(module, fullgraph=True, dynamic=True)
    # Dynamo wraps the fake's error; the original must be in the chain, word for word.
    _expect_same_error(lambda: compiled(*module.tensors(bad.args)), None, text, f"{where} compiled")


CHECKS: dict[str, Callable[[OpSpec, str, Path], None]] = {
    "numerics": check_numerics,
    "opcheck": check_opcheck,
    "gradcheck": check_gradcheck,
    "compile": check_compile,
    "bad_inputs": check_bad_inputs,
}
# Checks of a whole family at once: (specs, device, tmp_path). ``check_aoti`` takes any list of specs too; the suite
# runs it once over every family (tests/test_aoti.py: a package's C++ build has a large fixed cost).
FAMILY_CHECKS: dict[str, Callable[[list[OpSpec], str, Path], None]] = {"export": check_export}
SLOW_CHECKS = frozenset({"aoti"})


def devices() -> list[str]:
    """Devices the harness runs on here: ``$TORCH_ASCEND_MOE_DEVICES`` (comma-separated; what ``pytest --device``
    sets), else CPU always plus CUDA and Ascend (``torch.npu``, once torch_npu is imported) when present."""
    import os

    chosen = os.environ.get("TORCH_ASCEND_MOE_DEVICES")
    if chosen:
        return [d.strip() for d in chosen.split(",") if d.strip()]
    npu = getattr(torch, "npu", None)
    return (
        ["cpu"]
        + (["cuda"] if torch.cuda.is_available() else [])
        + (["npu"] if npu is not None and npu.is_available() else [])
    )


def contract_test(specs: list[OpSpec]):
    """A pytest test running every check on every spec and device; a family's test module binds it:

    ``test_op_contract = contract_test(SPECS)``. Per-op checks have ids ``<op>-<check>-<device>``, the family
    checks ``family-<check>-<device>``; an op that cannot be in an AOTInductor package keeps an
    ``<op>-aoti-<device>`` entry that skips with its reason (the package itself is built once for every family:
    ``check_aoti``, tests/test_aoti.py). The slow checks carry the ``slow`` marker.
    """
    import pytest

    def param(target, check):
        marks = [pytest.mark.slow] if check in SLOW_CHECKS else []
        return pytest.param(
            target, check, marks=marks, id=f"{target if isinstance(target, OpSpec) else 'family'}-{check}"
        )

    cases = [param(spec, check) for spec in specs for check in CHECKS]
    cases += [param(spec, "aoti") for spec in specs if spec.aoti is not True]
    cases += [param(list(specs), check) for check in FAMILY_CHECKS]

    @pytest.mark.parametrize("device", devices())
    @pytest.mark.parametrize(("target", "check"), cases)
    def test_op_contract(target, check, device, tmp_path):
        if isinstance(target, OpSpec):
            if target.devices is not None and device not in target.devices:
                pytest.skip(f"{target.name} runs on {', '.join(target.devices)} here")
            (skip_aoti if check == "aoti" else CHECKS[check])(target, device, tmp_path)
            return
        specs_here = [spec for spec in target if spec.devices is None or device in spec.devices]
        if not specs_here:
            pytest.skip(f"no op of this family runs on {device} here")
        FAMILY_CHECKS[check](specs_here, device, tmp_path)

    return test_op_contract
