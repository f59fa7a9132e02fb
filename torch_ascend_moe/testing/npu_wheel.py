"""torch_npu's own op schemas and meta rules on a machine without CANN: what the NPU adapters are checked
against in CI (specs/npu_triton_facts.md §3).

``load()`` fetches the pinned torch_npu wheel (the one matching torch's version) into a cache directory once
(``pip download --no-deps``; never installed: an installed torch_npu breaks ``import torch`` without CANN),
defines every ``npu::`` schema from the wheel's ``npu_native_functions_by_codegen.yaml`` and runs the wheel's
``_meta_registrations.py`` / ``_fake_registrations.py`` against a stand-in ``torch_npu`` module (error codes,
``get_cann_version``, ``get_soc_version``, torch_npu's dtype enums). After it, ``torch.ops.npu.<op>`` exists
with torch_npu's exact schema (argument names, keyword-only layout, defaults, outputs) and Meta kernel, so an
adapter written as ``torch.ops.npu.X(...)`` runs under ``FakeTensorMode``, on meta tensors and through
``torch.compile`` exactly as torch_npu would check it.

Values need a kernel: ``cpu_reference("npu_x")`` registers a CPU implementation of an op's documented semantics
(written from the wheel's docs, ``torch_npu/_op_plugin_docs.py``): our reading of Ascend's op, not Ascend's
kernel. Nothing of the wheel is vendored; the stand-in replaces only what the metas import. The wheel's two
``aten`` Meta overrides (``matmul_backward``, ``_convolution``) are not applied: they would replace torch's own
process-wide.

TorchAir (the wheel's ``torch_npu/dynamo/torchair``): ``torchair()`` unpacks its Python sources and imports them
with the same stand-ins plus an inert ``torchair.core._torchair`` (its C++ extension needs CANN; only
compile/run call it). That is TorchAir's real FX-to-GE conversion (``GeConcreteGraph``, every converter of
torch_npu's, our ``register_fx_node_ge_converter`` ones): ``ge_graph(fn, *inputs)`` traces ``fn`` and converts it
to the GE ``GraphDef`` TorchAir would hand to Ascend's graph engine, up to (not including) its compilation.

Cache: ``$TORCH_ASCEND_MOE_CACHE`` or ``~/.cache/torch_ascend_moe``. Offline without a cached wheel, ``load``
raises ``WheelUnavailable`` (tests skip on it, except under ``CI=true``, where a missing wheel is a failure).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
import subprocess
import sys
import types
import warnings
import zipfile
from pathlib import Path
from unittest import mock

import torch

VERSION = torch.__version__.split("+")[0]  # torch_npu X.Y.Z pins torch==X.Y.Z.*
_MEMBERS = (
    "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml",
    "torch_npu/op_plugin/meta/_meta_registrations.py",
    "torch_npu/op_plugin/meta/_fake_registrations.py",
    "torch_npu/utils/_error_code.py",
    "torch_npu/_op_plugin_docs.py",
)
# torch_npu's own dtype enums (ScalarType numbers beyond torch's), as the metas compare them.
NPU_DTYPES = {
    "int4": 285,
    "hifloat8": 290,
    "float8_e5m2": 291,
    "float8_e4m3fn": 292,
    "float8_e8m0fnu": 293,
    "float4_e2m1fn_x2": 296,
    "float4_e1m2fn_x2": 297,
}
# Ascend 950 is SoC >= 260 in the metas; A2/A3 below. The default is A3's (torch_npu 2.13's main target).
SOC = {"version": 250, "cann": "9.2.0"}


class WheelUnavailable(RuntimeError):
    """The torch_npu wheel is neither cached nor downloadable here."""


def cache_dir() -> Path:
    return Path(os.environ.get("TORCH_ASCEND_MOE_CACHE", Path.home() / ".cache" / "torch_ascend_moe"))


def wheel_root() -> Path:
    """The unpacked members of the torch_npu wheel for this torch (downloaded and unpacked on first use)."""
    root = cache_dir() / f"torch_npu-{VERSION}"
    if all((root / m).is_file() for m in _MEMBERS):
        return root
    cache_dir().mkdir(parents=True, exist_ok=True)
    wheels = sorted(cache_dir().glob(f"torch_npu-{VERSION}-*.whl"))
    if not wheels:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-q",
            f"torch-npu=={VERSION}",
            "-d",
            str(cache_dir()),
        ]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheels = sorted(cache_dir().glob(f"torch_npu-{VERSION}-*.whl"))
        if done.returncode or not wheels:
            raise WheelUnavailable(f"pip download torch-npu=={VERSION} failed: {done.stderr.strip()[-500:]}")
    with zipfile.ZipFile(wheels[-1]) as z:
        for member in _MEMBERS:
            z.extract(member, root)
    return root


def _stand_in(root: Path) -> dict[str, types.ModuleType]:
    """The modules ``_meta_registrations.py`` imports, as far as it uses them (the error codes are the wheel's)."""

    def module(name: str, package: bool = False, **attrs) -> types.ModuleType:
        m = types.ModuleType(name)
        if package:
            m.__path__ = []
        m.__dict__.update(attrs)
        return m

    npu_utils = module("torch_npu.npu.utils", get_cann_version=lambda *a, **k: SOC["cann"])
    backends = module("torch_npu.npu._backends", get_soc_version=lambda: SOC["version"])
    utils_utils = module("torch_npu.utils.utils", _is_interactive_command_line=lambda: False)
    mods = {
        "torch_npu": module("torch_npu", package=True, **NPU_DTYPES),
        "torch_npu.utils": module("torch_npu.utils", package=True),
        "torch_npu.utils.utils": utils_utils,
        "torch_npu.npu": module("torch_npu.npu", package=True, utils=npu_utils, _backends=backends),
        "torch_npu.npu.utils": npu_utils,
        "torch_npu.npu._backends": backends,
    }
    codes = module("torch_npu.utils._error_code")
    mods["torch_npu.utils._error_code"] = codes
    mods["torch_npu.utils"]._error_code = codes
    mods["torch_npu.utils"].utils = utils_utils
    with mock.patch.dict(sys.modules, mods), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the file has invalid escape sequences
        path = root / "torch_npu/utils/_error_code.py"
        exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), codes.__dict__)  # noqa: S102
    mods["torch_npu"].uint8 = torch.uint8
    mods["torch_npu"].utils = mods["torch_npu.utils"]
    mods["torch_npu"].npu = mods["torch_npu.npu"]
    return mods


class _NoAtenOverride(torch.library.Library):
    """Stands in for the metas' ``Library("aten", "IMPL", "Meta")``: its registrations are dropped (a subclass,
    so ``torch.library.impl`` still takes the library form)."""

    def impl(self, *args, **kwargs) -> None:
        return None


class NpuOps:
    """What ``load()`` returns: the libraries and module globals that keep the definitions alive."""

    def __init__(self, root: Path, libraries: list, namespaces: list[dict], failed: dict[str, str]):
        self.root, self.libraries, self.namespaces, self.failed = root, libraries, namespaces, failed
        self.cpu = torch.library.Library("npu", "IMPL", "CPU")  # cpu_reference's kernels
        self.references: dict[str, object] = {}

    @property
    def ops(self):
        return torch.ops.npu

    def docs(self, name: str) -> str:
        """The wheel's docstring of ``torch_npu.<name>`` (``_op_plugin_docs.py``)."""
        text = (self.root / "torch_npu/_op_plugin_docs.py").read_text(encoding="utf-8")
        # Entries are ``_add_torch_npu_docstr(\n    "<name>",\n    """...""")``: match the quoted name exactly
        # (a prefix search would find npu_mhc_pre_backward for npu_mhc_pre).
        start = text.find(f'_add_torch_npu_docstr(\n    "{name}",')
        if start < 0:
            return ""
        end = text.find("_add_torch_npu_docstr(", start + 1)
        return text[start : end if end >= 0 else len(text)]


@functools.cache
def load() -> NpuOps:
    """Define torch_npu's ``npu::`` schemas and Meta kernels in this process (once)."""
    import yaml

    root = wheel_root()
    spec = yaml.safe_load((root / _MEMBERS[0]).read_text(encoding="utf-8"))
    lib = torch.library.Library("npu", "DEF")
    failed: dict[str, str] = {}
    defined: set[str] = set()
    for section in spec.values() if isinstance(spec, dict) else ():
        for entry in section if isinstance(section, list) else ():
            func = entry.get("func") if isinstance(entry, dict) else None
            if not func or func.split("(")[0] in defined:
                continue
            try:
                lib.define(func)
                defined.add(func.split("(")[0])
            except Exception as e:  # noqa: BLE001  (a few entries are duplicates or use defaults torch rejects)
                failed[func.split("(")[0]] = str(e).splitlines()[0]
    real_library = torch.library.Library

    def library(ns, kind, dispatch_key=""):
        return _NoAtenOverride(ns, kind, dispatch_key) if ns == "aten" else real_library(ns, kind, dispatch_key)

    namespaces = []
    with mock.patch.dict(sys.modules, _stand_in(root)), mock.patch.object(torch.library, "Library", library):
        for member in _MEMBERS[1:3]:
            path = root / member
            scope = {"__name__": f"torch_npu.op_plugin.meta.{path.stem}", "__file__": str(path)}
            exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), scope)  # noqa: S102
            namespaces.append(scope)
    return NpuOps(root, [lib], namespaces, failed)


_TORCHAIR = "torch_npu/dynamo/torchair/"


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in v.split(".")[:3] if p.isdigit())


class _Inert(types.ModuleType):
    """Stands in for TorchAir's C++ extension ``_torchair``: any attribute is an empty class (some are base
    classes at import; the rest are called only to compile or run a graph, which needs CANN anyway)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        cls = type(name, (), {"__init__": lambda self, *a, **k: None})
        setattr(self, name, cls)
        return cls


def _scoped(module: str) -> bool:
    """Modules that live in ``sys.modules`` only inside ``TorchAir.active()``."""
    return module.split(".")[0] in ("torchair", "torch_npu")


class TorchAir:
    """TorchAir's Python modules from the wheel, importable only inside ``with torchair.active():`` (its
    modules and the torch_npu stand-ins live in ``sys.modules`` only there, so nothing else in the process
    sees a ``torch_npu``)."""

    def __init__(self, modules: dict[str, types.ModuleType]):
        self.modules = modules

    @contextlib.contextmanager
    def active(self):
        """TorchAir importable inside the block. Modules first imported inside (TorchAir imports lazily) are kept:
        TorchAir's and the stand-ins' for the next block, everything else (torch's own) in ``sys.modules``, so
        nothing is imported twice."""
        before = set(sys.modules)
        with mock.patch.dict(sys.modules, self.modules):
            try:
                yield self
            finally:
                loaded = {k: v for k, v in sys.modules.items() if k not in before}
        self.modules.update({k: v for k, v in loaded.items() if _scoped(k)})
        sys.modules.update({k: v for k, v in loaded.items() if not _scoped(k)})

    def converter(self, op):
        """The GE converter TorchAir would call for ``op`` (an OpOverload), or None."""
        return getattr(op, "_ge_converter", None)


@functools.cache
def torchair() -> TorchAir:
    """Unpack TorchAir's sources from the wheel (once) and import its FX-to-GE converter with every converter
    it registers (torch_npu's for the ``npu::`` ops defined by ``load()``, ours from ``backends.npu``)."""
    ops = load()
    root = cache_dir() / f"torch_npu-{VERSION}"
    marker = root / "torchair.unpacked"  # written last: an interrupted unpack is redone
    if not marker.is_file():
        with zipfile.ZipFile(sorted(cache_dir().glob(f"torch_npu-{VERSION}-*.whl"))[-1]) as z:
            for member in z.namelist():
                if member.startswith(_TORCHAIR) and member.endswith(".py"):
                    z.extract(member, root)
        marker.write_text("ok\n", encoding="utf-8")
    base = root / _TORCHAIR
    mods = _stand_in(ops.root)
    npu = mods["torch_npu.npu"]
    npu.get_device_name = lambda *a: "Ascend950" if SOC["version"] >= 260 else "Ascend910_9392"
    npu.utils._is_gte_cann_version = lambda v, *a: _version_tuple(SOC["cann"]) >= _version_tuple(v)
    npu.is_available = lambda: False
    npu._get_deterministic_level = lambda: 0
    for name, path in (("torchair", base), ("torchair.core", base / "core")):
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(path)]
        mods[name] = pkg
    inert = _Inert("torchair.core._torchair")
    # Asked when an IR op is built with a newer optional input/attribute: "" = the installed CANN has it (the
    # CANN release the wheel is built for, SOC["cann"], is assumed).
    inert.check_cann_compat = lambda *a: ""
    mods["torchair.core._torchair"] = inert
    before = set(sys.modules)
    with mock.patch.dict(sys.modules, mods), warnings.catch_warnings():
        # torch_npu's converter package imports every converter module and warns for each whose npu:: op the
        # YAML does not define (ops of other builds); those converters are not ours to check.
        warnings.simplefilter("ignore")
        importlib.import_module("torchair._ge_concrete_graph.fx2ge_converter")
        importlib.import_module("torchair._ge_concrete_graph.ge_converter.custom")
        importlib.import_module("torchair._ge_concrete_graph.ge_converter.aten")
        importlib.import_module("torchair.npu_fx_compiler")
        loaded = {k: v for k, v in sys.modules.items() if k not in before}
    # Only TorchAir and the stand-ins are scoped; what else it imported (torch's own inductor/quantization
    # modules) stays imported, as it would have been: removing those would make torch import them twice.
    scoped = {k: v for k, v in loaded.items() if _scoped(k)}
    sys.modules.update({k: v for k, v in loaded.items() if k not in scoped})
    from torch_ascend_moe.backends import npu as ours

    air = TorchAir({**mods, **scoped})
    with air.active():
        ours.register_ge_converters()
    return air


def _as_tuple(out) -> tuple:
    """Graph outputs as a tuple, as AOT graphs return them (TorchAir iterates over them)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def ge_graph(fn, *inputs, soc: int | None = None, dynamic: bool = False):
    """The GE ``GraphDef`` TorchAir's GE mode builds for ``fn(*inputs)``: ``fn`` traced to aten/npu/ascend_moe
    ops under FakeTensorMode (fake copies of ``inputs``; with ``dynamic``, every dimension symbolic, as
    ``torch.compile(dynamic=True)`` hands TorchAir), each node converted by its registered converter, the
    graph's outputs set; TorchAir's compile step (CANN) is not run."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    air = torchair()
    with air.active(), mock.patch.dict(SOC, {} if soc is None else {"version": soc}):
        fx2ge = sys.modules["torchair._ge_concrete_graph.fx2ge_converter"]
        config = sys.modules["torchair.configs.compiler_config"].CompilerConfig()
        converter = sys.modules["torchair.npu_fx_compiler"]._NpuGraphConverter
        traced = lambda *xs: _as_tuple(fn(*xs))  # noqa: E731
        if dynamic:
            gm = make_fx(traced, tracing_mode="symbolic")(*inputs)
            fakes = [n.meta["val"] for n in gm.graph.nodes if n.op == "placeholder"]
            mode = detect_fake_mode(fakes)
        else:
            mode = FakeTensorMode(allow_non_fake_inputs=True)
            fakes = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in inputs]
            with mode:
                gm = make_fx(traced, tracing_mode="fake")(*fakes)
        # GeConcreteGraph starts Ascend's graph engine (CANN) when built: the one step left out here.
        with mode, mock.patch.object(fx2ge, "initialize_graph_engine", lambda *a, **k: None):
            graph = fx2ge.GeConcreteGraph(config, name="ascend_moe")
            converter(gm, graph=graph, garbage_collect_values=False).run(*fakes)
    return graph.graph, gm


class _Reached(RuntimeError):
    """Raised where Ascend's graph engine would take over (the compiled graph's first run)."""


def compile_ge(fn, *inputs, soc: int | None = None, dynamic: bool = False, configure=None):
    """The GE ``GraphDef`` that ``torch.compile(fn, backend=<TorchAir's npu backend>, fullgraph=True)`` builds:
    dynamo, AOT autograd with TorchAir's decompositions, its FX passes, the conversion (every converter), its
    graph optimizations; captured at the compiled graph's first run, where CANN's graph engine would compile and
    run it. Returns ``(graph, feeds)``: ``feeds`` are the values of the graph's Data inputs in index order (dynamo
    orders a graph's inputs itself, and adds the symbolic sizes as inputs with ``dynamic``). ``configure(config)``
    may change TorchAir's ``CompilerConfig`` first (its post-grad passes, say)."""
    air = torchair()
    captured = {}

    def first_run(self, *args, **kwargs):
        captured["graph"] = self.graph
        raise _Reached

    with air.active(), mock.patch.dict(SOC, {} if soc is None else {"version": soc}):
        fx2ge = sys.modules["torchair._ge_concrete_graph.fx2ge_converter"]
        config = sys.modules["torchair.configs.compiler_config"].CompilerConfig()
        if configure is not None:
            configure(config)
        npu_backend = sys.modules["torchair.npu_fx_compiler"].get_npu_backend(compiler_config=config)

        def backend(gm, example_inputs):
            captured["feeds"] = [x if isinstance(x, torch.Tensor) else torch.tensor(int(x)) for x in example_inputs]
            return npu_backend(gm, example_inputs)

        torch._dynamo.reset()
        with (
            mock.patch.object(fx2ge, "initialize_graph_engine", lambda *a, **k: None),
            mock.patch.object(fx2ge.GeConcreteGraph, "__call__", first_run),
        ):
            try:
                torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*inputs)
            except _Reached:
                pass
            except Exception as e:  # dynamo wraps a backend's exception
                if not isinstance(e.__cause__, _Reached) and "_Reached" not in repr(e):
                    raise
        torch._dynamo.reset()
    graph, feeds = captured["graph"], captured["feeds"]
    # Each Data node is an AOT placeholder ``arg<N>_1``: input N of the backend; sizes TorchAir reads off tensors
    # (dynamic) have no Data node.
    data = sorted((op.attr["index"].i, op.name) for op in graph.op if op.type == "Data")
    return graph, [feeds[int(re.fullmatch(r"arg(\d+)_\d+", name).group(1))] for _, name in data]


def cpu_reference(name: str):
    """Register ``fn`` as the CPU kernel of ``npu::<name>`` (our reading of its documented semantics), so an
    adapter's glue can be checked for values on CPU tensors."""

    def register(fn):
        ops = load()
        if name in ops.references:  # a second reference would silently replace the first (import order)
            raise RuntimeError(f"npu_wheel.cpu_reference: npu::{name} already has a CPU reference")
        ops.cpu.impl(name, fn)
        ops.references[name] = fn
        return fn

    return register


__all__ = [
    "NPU_DTYPES",
    "SOC",
    "NpuOps",
    "TorchAir",
    "WheelUnavailable",
    "compile_ge",
    "cpu_reference",
    "ge_graph",
    "load",
    "torchair",
    "wheel_root",
]
