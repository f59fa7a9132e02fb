"""The package's import map: no circle between modules (imports inside functions count: a circle held apart by a
late import is still a circle), no import that runs up a layer, and the expert-parallel stack in the order its
package docstrings draw. Read from the source (``ast``), so a new module is checked without being listed."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "torch_ascend_moe"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The module ``name`` (a module, or a name inside one) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """The package's modules ``module`` imports, anywhere in its body (a parent package's own import excluded:
    importing a submodule runs its parents first anyway)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("torch_ascend_moe"):
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module for a in node.names
            ]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("torch_ascend_moe")]
        for name in names:
            target = _owner(name)
            if target and target != module and not module.startswith(target + "."):
                found.add(target)
    return found


GRAPH = {m: _imports(m) for m in MODULES}


def _circles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(MODULES):
        if v not in index:
            visit(v)
    return found


def test_no_circles():
    assert _circles() == []


def test_the_circle_finder_finds_a_circle():
    """A self-check on a made-up graph, so an empty answer above means something."""
    saved = dict(GRAPH)
    try:
        GRAPH["torch_ascend_moe.distributed.waits"] = GRAPH["torch_ascend_moe.distributed.waits"] | {
            "torch_ascend_moe.distributed.agreement"
        }
        assert any("torch_ascend_moe.distributed.waits" in c for c in _circles())
    finally:
        GRAPH.clear()
        GRAPH.update(saved)


def _top(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


# What each part of the package may import from the others (the rest of its own part is always allowed). Bottom
# up: the C++ library, the argument checks, the registry and the plain-torch math every layer shares; the
# distributed layer; encodings; fakes and FLOP formulas; kernels and backward formulas; the op wrappers and
# compiler passes; the compat packages; models, benchmarks, the CLI.
_BASE = {"_C", "checks", "_registry", "_arith", "routing_math"}
_ALLOWED = {
    "_C": set(),
    "checks": set(),
    "_arith": set(),
    "routing_math": set(),
    "_registry": {"_C"},
    "distributed": _BASE,
    "fakes": _BASE | {"distributed", "quant"},
    "flops": _BASE,
}
_COMPAT = {"deep_gemm", "deep_ep", "flash_mla", "deep_select", "tile_kernels"}
_ABOVE_KERNELS = _COMPAT | {"nn", "hf", "_hf_hook", "bench", "demo", "cli", "__main__", "testing"}


@pytest.mark.parametrize("part", sorted(_ALLOWED))
def test_lower_layers_import_only_below(part):
    wrong = {
        (m, t)
        for m, targets in GRAPH.items()
        if _top(m) == part
        for t in targets
        if _top(t) != part and _top(t) not in _ALLOWED[part]
    }
    assert wrong == set()


@pytest.mark.parametrize("part", ["backends", "autograd", "fakes", "flops", "ops", "inductor_lowerings", "quant"])
def test_kernels_and_ops_never_import_compat_or_models(part):
    wrong = {(m, t) for m, targets in GRAPH.items() if _top(m) == part for t in targets if _top(t) in _ABOVE_KERNELS}
    assert wrong == set()


def _drawn_order(package: str) -> list[str]:
    """The modules a package docstring draws, top to bottom: the first word of each indented line that names a
    module of the package."""
    doc = ast.get_docstring(ast.parse(MODULES[package].read_text())) or ""
    names = [m.group(1) for m in re.finditer(r"^ {4}(\w+)\b", doc, re.M)]
    return [n for n in names if f"{package}.{n}" in MODULES]


def test_distributed_modules_import_only_those_above_them():
    """``distributed/__init__``'s list, bottom up: each module imports only modules listed before it."""
    package = "torch_ascend_moe.distributed"
    order = _drawn_order(package)
    assert set(order) == {m.rpartition(".")[2] for m in MODULES if m.startswith(package + ".")}
    for i, name in enumerate(order):
        inside = {t.rpartition(".")[2] for t in GRAPH[f"{package}.{name}"] if t.startswith(package + ".")}
        assert inside <= set(order[:i]), f"{name} imports {sorted(inside - set(order[:i]))}, listed after it"


def test_ep_stages_never_import_a_later_stage():
    """``backends/portable/ep``'s pipeline, read top to bottom: no stage imports one drawn after it, and the
    distributed layer below it imports none of them."""
    package = "torch_ascend_moe.backends.portable.ep"
    order = _drawn_order(package)
    assert order[:4] == ["layout", "dispatch", "expand", "combine"], order
    for i, name in enumerate(order):
        later = {f"{package}.{n}" for n in order[i + 1 :]}
        assert not GRAPH[f"{package}.{name}"] & later, name
    below = {t for m, ts in GRAPH.items() if m.startswith("torch_ascend_moe.distributed") for t in ts}
    assert not {t for t in below if t.startswith(package)}


def _reach(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        m = todo.pop()
        parent = m.rpartition(".")[0]  # importing a submodule runs its package's __init__ (not the root's: every
        # module of the package is imported from it)
        for t in GRAPH[m] | ({parent} if parent in MODULES and parent != "torch_ascend_moe" else set()):
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


@pytest.mark.parametrize("module", ["quant.encodings", "quant.reference", "routing_math", "_arith", "checks"])
def test_shared_math_imports_no_op_layer(module):
    """The plain-torch math kernels and references share (and the package ``__init__`` files it runs) reaches no op
    wrapper and no kernel module: every layer may import it."""
    reached = _reach(f"torch_ascend_moe.{module}")
    assert not {m for m in reached if _top(m) in ("ops", "backends", "fakes", "autograd")}
