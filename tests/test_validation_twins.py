"""Validation twins: each family's C++ checks (csrc/ops/<family>_checks.h) and Python checks
(torch_ascend_moe/checks/<family>.py) define the same check functions, making the same checks in the same order
with the same words; the shared helpers (checks.h, checks/__init__.py) likewise.

Each side is read as source: per function, the sequence of calls to check functions (``check_arg`` /
``AM_CHECK_ARG`` and every function the Python side defines), each with the message pieces it passes (string
literals and named constants such as the op name as text, f-strings and ``+`` concatenations as templates with
``{}`` for the computed parts, a ternary as ``x|y``, ``None`` and ``std::nullopt`` as ``None``; computed values drop
out). A check one side gains and the other lacks, a reworded message or a reordered check fails here, before any
bad-input test runs.

An op with no C++ kernel (a device-generic Python kernel only) has no C++ checks to twin: a family lists the
Python check functions of such ops in ``PYTHON_ONLY`` (function -> the ops it checks), and those are compared with
nothing, once this test has read from the ``TORCH_LIBRARY_IMPL`` registrations in ``csrc/ops/*.cpp`` that none of
their ops has a C++ kernel and that none of them has a C++ function of its name. A family whose checks are all
Python-only needs no C++ header.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc" / "ops"
PY = ROOT / "torch_ascend_moe" / "checks"


def families() -> list[str]:
    cpp = {p.name.removesuffix("_checks.h") for p in CSRC.glob("*_checks.h")}
    py = {p.stem for p in PY.glob("*.py") if p.stem != "__init__"}
    return sorted(cpp | py)


def twin_paths(family: str) -> tuple[Path, Path]:
    if family == "common":
        return CSRC / "checks.h", PY / "__init__.py"
    return CSRC / f"{family}_checks.h", PY / f"{family}.py"


def module_name(family: str) -> str:
    return "torch_ascend_moe.checks" + ("" if family == "common" else f".{family}")


def python_only(family: str) -> dict[str, tuple[str, ...]]:
    """The family's check functions of ops without a C++ kernel (its ``PYTHON_ONLY``): function -> ops."""
    return dict(getattr(importlib.import_module(module_name(family)), "PYTHON_ONLY", {}))


def cpp_kernels() -> set[str]:
    """Every op (``namespace::name``, overload dropped) that a ``TORCH_LIBRARY_IMPL`` block in csrc/ops registers."""
    ops = set()
    for path in CSRC.glob("*.cpp"):
        src = strip_comments(path.read_text())
        for m in re.finditer(r"\bTORCH_LIBRARY_IMPL\(\s*(\w+)\s*,[^)]*\)\s*\{", src):
            body = src[m.end() - 1 : closing(src, m.end() - 1)]
            ops |= {f"{m.group(1)}::{name}" for name in re.findall(r'\.impl\(\s*"(\w+)', body)}
    return ops


def check_names() -> set[str]:
    """``check_arg`` and every Python check function that reaches it: the calls compared."""
    trees = [ast.parse(path.read_text()) for path in PY.glob("*.py")]
    defs = [fn for tree in trees for fn in tree.body if isinstance(fn, ast.FunctionDef)]
    called = {
        fn.name: {getattr(c.func, "attr", getattr(c.func, "id", None)) for c in ast.walk(fn) if isinstance(c, ast.Call)}
        for fn in defs
    }
    names = {"check_arg"}
    while grown := {name for name, calls in called.items() if calls & names} - names:
        names |= grown
    return names


def message_pieces(name: str, texts) -> tuple:
    """A check call as its name and the message pieces it passes: computed values drop out, so a family function
    taking the op's arguments as a namespace (Python) or one by one (C++) compares by its words."""
    return (name, *(t for t in texts if t != "{}"))


# ---- C++ side -------------------------------------------------------------------------------------------------


def strip_comments(src: str) -> str:
    out, i, n = [], 0, len(src)
    while i < n:
        if src[i] == '"':
            j = i + 1
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            out.append(src[i : j + 1])
            i = j + 1
        elif src.startswith("//", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
        elif src.startswith("/*", i):
            i = src.find("*/", i) + 2
        else:
            out.append(src[i])
            i += 1
    return "".join(out)


def split_top(src: str, seps: tuple[str, ...]) -> list[str]:
    """Splits at top-level separators (outside brackets and string literals)."""
    parts, depth, i, start = [], 0, 0, 0
    while i < len(src):
        ch = src[i]
        if ch == '"':
            i += 1
            while src[i] != '"':
                i += 2 if src[i] == "\\" else 1
        elif ch == "'":
            i = src.index("'", i + 2 if src[i + 1] == "\\" else i + 1)
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and any(src.startswith(s, i) for s in seps):
            sep = next(s for s in seps if src.startswith(s, i))
            parts.append(src[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(src[start:])
    return [p.strip() for p in parts]


def closing(src: str, open_at: int) -> int:
    """Index of the bracket closing the one at ``open_at``."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    depth, i = 0, open_at
    while True:
        ch = src[i]
        if ch == '"':
            i += 1
            while src[i] != '"':
                i += 2 if src[i] == "\\" else 1
        elif ch == "'":
            i = src.index("'", i + 2 if src[i + 1] == "\\" else i + 1)
        elif ch in pairs:
            depth += 1
        elif ch in pairs.values():
            depth -= 1
            if depth == 0:
                return i
        i += 1


def cpp_constants(src: str) -> dict[str, str]:
    return dict(re.findall(r'constexpr const char\*\s+(\w+)\s*=\s*"((?:[^"\\]|\\.)*)";', src))


def cpp_text(expr: str, consts: dict[str, str]) -> str:
    expr = expr.strip()
    while expr.startswith("(") and closing(expr, 0) == len(expr) - 1:
        expr = expr[1:-1].strip()
    expr = re.sub(r"\.c_str\(\)$", "", expr)
    while expr.startswith("(") and closing(expr, 0) == len(expr) - 1:
        expr = expr[1:-1].strip()
    if m := re.fullmatch(r'std::string\((".*")\)', expr):
        expr = m.group(1)
    if re.fullmatch(r'"(?:[^"\\]|\\.)*"', expr):
        return expr[1:-1].replace('\\"', '"')
    if re.fullmatch(r"-?\d+", expr):
        return expr
    if expr == "std::nullopt":
        return "None"
    if expr in consts:
        return consts[expr]
    pieces = split_top(expr, ("+",))
    if len(pieces) > 1:
        texts = [cpp_text(p, consts) for p in pieces]
        if any(t != "{}" for t in texts):
            return "".join(texts)
        return "{}"
    branches = split_top(expr, ("?",))
    if len(branches) == 2:
        alternatives = split_top(branches[1], (":",))
        texts = [cpp_text(a, consts) for a in alternatives]
        if len(texts) == 2 and all(t != "{}" for t in texts):
            return "|".join(texts)
    return "{}"


def cpp_functions(src: str) -> dict[str, list[tuple]]:
    """Per function defined at the top level of a header: its calls to check functions. Constants are the
    header's and those of checks.h, which every header includes."""
    src = strip_comments(src)
    consts = {**cpp_constants(strip_comments((CSRC / "checks.h").read_text())), **cpp_constants(src)}
    names = check_names()
    out: dict[str, list[tuple]] = {}
    for m in re.finditer(r"^(?:inline |static )*[\w:<>,\s*&]+?\b(\w+)\(", src, re.M):
        close = closing(src, m.end() - 1)
        after = src[close + 1 :].lstrip()
        if not after.startswith("{") or m.group(1) in ("if", "for", "while", "return"):
            continue
        body_start = src.index("{", close)
        body = src[body_start : closing(src, body_start) + 1]
        calls = []
        for c in re.finditer(r"\b(AM_CHECK_ARG|\w+)\s*\(", body):
            name = "check_arg" if c.group(1) == "AM_CHECK_ARG" else c.group(1)
            if name not in names:
                continue
            args = split_top(body[c.end() : closing(body, c.end() - 1)], (",",))
            calls.append(message_pieces(name, (cpp_text(a, consts) for a in args)))
        out[m.group(1)] = calls
    return out


# ---- Python side ----------------------------------------------------------------------------------------------


def py_text(node: ast.AST, namespace: dict) -> str:
    if isinstance(node, ast.Lambda):
        return py_text(node.body, namespace)
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)) and not isinstance(node.value, bool):
        return str(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return f"-{node.operand.value}"
    if isinstance(node, ast.Constant) and node.value is None:
        return "None"
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else py_text(v.value, namespace) for v in node.values)
    if isinstance(node, (ast.Name, ast.Attribute)):
        value = namespace.get(node.id) if isinstance(node, ast.Name) else None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            owner = namespace.get(node.value.id)
            value = getattr(owner, node.attr, None) if owner is not None else None
        return value if isinstance(value, str) else "{}"
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        texts = [py_text(node.left, namespace), py_text(node.right, namespace)]
        return "".join(texts) if any(t != "{}" for t in texts) else "{}"
    if isinstance(node, ast.IfExp):
        texts = [py_text(node.body, namespace), py_text(node.orelse, namespace)]
        if all(t != "{}" for t in texts):
            return "|".join(texts)
    return "{}"


def py_calls(fn: ast.FunctionDef, names: set[str], namespace: dict) -> list[tuple]:
    """The check calls in ``fn``, in source order."""
    calls = []
    for node in sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset)):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
        if name in names:
            args = [*node.args, *(k.value for k in node.keywords)]
            calls.append(message_pieces(name, (py_text(a, namespace) for a in args)))
    return calls


def py_functions(src: str, namespace: dict) -> dict[str, list[tuple]]:
    names = check_names()
    return {fn.name: py_calls(fn, names, namespace) for fn in ast.parse(src).body if isinstance(fn, ast.FunctionDef)}


def with_checks(functions: dict[str, list[tuple]]) -> dict[str, list[tuple]]:
    return {name: calls for name, calls in functions.items() if calls}


# ---- the tests ----------------------------------------------------------------------------------------------


def py_twin_functions(family: str) -> dict[str, list[tuple]]:
    """The family's Python check functions that have a C++ twin (all but the Python-only ones)."""
    py_path = twin_paths(family)[1]
    py = with_checks(py_functions(py_path.read_text(), vars(importlib.import_module(module_name(family)))))
    return {name: calls for name, calls in py.items() if name not in python_only(family)}


@pytest.mark.parametrize("family", families())
def test_both_twins_exist(family):
    cpp, py = twin_paths(family)
    assert py.exists(), f"{cpp.relative_to(ROOT)} has no Python twin {py.relative_to(ROOT)}"
    if py_twin_functions(family):
        assert cpp.exists(), f"{py.relative_to(ROOT)} has no C++ twin {cpp.relative_to(ROOT)}"


@pytest.mark.parametrize("family", ["common", *families()])
def test_twins_make_the_same_checks(family):
    cpp_path, _ = twin_paths(family)
    py = py_twin_functions(family)
    if not cpp_path.exists() and not py:
        return  # every check is Python-only (test_python_only_checks_have_no_cpp_kernel)
    cpp = with_checks(cpp_functions(cpp_path.read_text()))
    assert cpp, f"no checks read from {cpp_path.relative_to(ROOT)}"
    assert sorted(cpp) == sorted(py), "the check functions differ"
    for name in cpp:
        assert cpp[name] == py[name], f"{name}: C++ and Python checks differ"


@pytest.mark.parametrize("family", families())
def test_checks_live_in_the_twins(family):
    """A family with twins validates nowhere else: its fakes and C++ kernels call the twins."""
    fakes = ROOT / "torch_ascend_moe" / "fakes" / f"{family}.py"
    kernel = CSRC / f"{family}_cpu.cpp"
    if fakes.exists():
        assert "check_arg(" not in fakes.read_text(), f"{fakes.relative_to(ROOT)} still makes checks"
    if kernel.exists():
        assert "AM_CHECK_ARG(" not in strip_comments(kernel.read_text()), f"{kernel.name} still makes checks"


@pytest.mark.parametrize("family", families())
def test_python_only_checks_have_no_cpp_kernel(family):
    """``PYTHON_ONLY`` hides no missing twin: each listed function checks (and names) only ops that no C++ kernel
    implements, and no C++ function of its name exists to be compared with."""
    listed = python_only(family)
    if not listed:
        return
    cpp_path, py_path = twin_paths(family)
    py = with_checks(py_functions(py_path.read_text(), vars(importlib.import_module(module_name(family)))))
    cpp = cpp_functions(cpp_path.read_text()) if cpp_path.exists() else {}
    kernels = cpp_kernels()
    assert kernels, "no C++ kernel registration read from csrc/ops"
    for name, ops in listed.items():
        assert name in py, f"PYTHON_ONLY names {name}, which is no check function of {py_path.relative_to(ROOT)}"
        assert name not in cpp, f"{name} has a C++ twin in {cpp_path.relative_to(ROOT)}: compare it"
        assert ops and all(op.startswith("ascend_moe::") for op in ops), f"{name}: ops as 'ascend_moe::<op>'"
        assert not set(ops) & kernels, f"{name}: {sorted(set(ops) & kernels)} have a C++ kernel"
        named = {t for call in py[name] for t in call[1:] if re.fullmatch(r"ascend_moe(_kernels)?::\w+", t)}
        assert named <= set(ops), f"{name} checks {sorted(named - set(ops))}, not listed as its ops"


def test_the_python_only_rule_sees_kernels():
    """cpp_kernels reads the registrations (the property the exemption relies on): ops with a C++ kernel are there,
    a device-generic op is not."""
    kernels = cpp_kernels()
    assert {"ascend_moe::quantize_fp8", "ascend_moe::dequantize", "ascend_moe_kernels::ep_combine_reduce"} <= kernels
    assert "ascend_moe::quantize_blocks" not in kernels


def test_a_gained_check_fails():
    """The comparison sees a check one side lacks and a reworded one (the property the twin tests rely on)."""
    cpp = (
        'constexpr const char* kOp = "ascend_moe::f";\n'
        "inline void f(const at::Tensor& a, const at::Tensor& b, const std::string& sa) {\n"
        '  AM_CHECK_ARG(a.dim() == 2, kOp, "a", "rank", "2", a.dim());\n'
        '  check_rank(kOp, "b", b, 2, ("[" + sa + "]").c_str());\n}\n'
    )
    first = '    ck.check_arg(a.dim() == 2, OP, "a", "rank", "2", lambda: a.dim())\n'
    second = '    ck.check_rank(OP, "b", b, 2, f"[{sa}]")\n'
    namespace = {"OP": "ascend_moe::f"}
    assert cpp_functions(cpp) == {
        "f": [("check_arg", "ascend_moe::f", "a", "rank", "2"), ("check_rank", "ascend_moe::f", "b", "2", "[{}]")]
    }
    assert cpp_functions(cpp) == py_functions("def f(a, b, sa):\n" + first + second, namespace)
    assert cpp_functions(cpp) != py_functions("def f(a, b, sa):\n" + first, namespace)
    assert cpp_functions(cpp) != py_functions("def f(a, b, sa):\n" + second + first, namespace)
    assert cpp_functions(cpp) != py_functions("def f(a, b, sa):\n" + first + second.replace("[", "("), namespace)
