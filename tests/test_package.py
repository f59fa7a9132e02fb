"""The package as a whole: cheap import, live registrations, backends, CLI, FLOP counting, golden graph."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from expecttest import assert_expected_inline
from torch.utils.flop_counter import FlopCounterMode

import torch_ascend_moe
from torch_ascend_moe import backends, cli
from torch_ascend_moe.backends import portable


def _spec_names() -> list[str]:
    """Every op a family's harness specs cover: the inventory the dispatcher must match (no list is kept)."""
    from tests._families import family_specs

    return sorted(spec.name for specs in family_specs().values() for spec in specs)


OPS = _spec_names()


def _python(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, **kwargs)


def test_import_is_cheap():
    """No device probing or NPU import at import time, so export/AOTI loaders can import it freely."""
    script = (
        "import sys, torch\n"
        "import torch_ascend_moe\n"
        "assert 'torch_npu' not in sys.modules\n"
        "assert not torch.cuda.is_initialized()\n"
        "assert 'torch._inductor.compile_fx' not in sys.modules\n"
        "print('ok')\n"
    )
    result = _python("-c", script)
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ldd: Linux")
def test_extension_uses_the_shared_cpp_runtime():
    """``_C`` loads the process's libstdc++, not a static copy of its own (setup.py names it: the lent H200's compiler
    links libstdc++ statically, and there every argument error of a C++ kernel crashed in the second copy's stream
    code); and a number formats into an error message (with a second copy it came out empty)."""
    assert (
        "libstdc++.so" in subprocess.run(["ldd", torch_ascend_moe._C.__file__], capture_output=True, text=True).stdout
    )
    with pytest.raises(ValueError, match=r"expected 3 \(a.size\(1\)\), got 5"):
        torch_ascend_moe.bf16_gemm(torch.randn(2, 3), torch.randn(4, 5))


def test_every_op_is_registered_with_all_capabilities():
    assert cli.op_names() == OPS
    for name in OPS:
        caps = cli.capabilities(name)
        assert caps["CPU"] and caps["fake"] and caps["autograd"] and caps["flops"] and caps["pt2"], (name, caps)


def test_missing_fakes_hint_names_the_family_module():
    """With only the C++ library loaded, compiling fails with a hint to import the family's fake module."""
    script = (
        "import sys, torch\n"
        "torch.ops.load_library(sys.argv[1])\n"
        "a = torch.randn(2, 4)\n"
        "try:\n"
        "    torch.compile(lambda a: torch.ops.ascend_moe.bf16_gemm(a, a), fullgraph=True)(a)\n"
        "except Exception as e:\n"
        "    print(e)\n"
    )
    result = _python("-c", script, torch_ascend_moe._C.__file__)
    assert "torch_ascend_moe.fakes.gemm" in result.stdout, result.stdout + result.stderr


def test_backend_registration_hooks():
    assert backends.REGISTERED["npu"] is False  # torch_npu cannot be imported here
    assert backends.register_npu() is False
    # The portable kernels are registered once, under CompositeExplicitAutograd: every device key sees them.
    for name in OPS:
        for key in ("CUDA", "PrivateUse1"):
            assert torch._C._dispatch_has_computed_kernel_for_dispatch_key(f"ascend_moe::{name}", key), (name, key)
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"ascend_moe::{name}", "CompositeExplicitAutograd")
    assert set(portable.__dict__) >= {"gemm", "ep", "mqa_logits"}  # the package imports every family module


def test_flop_counter_counts_gemm_flops():
    a, b = torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16)
    x, w = torch.randn(3, 4, 16, dtype=torch.bfloat16), torch.randn(4, 8, 16, dtype=torch.bfloat16)
    with FlopCounterMode(display=False) as counter:
        torch_ascend_moe.bf16_gemm(a, b)
        torch_ascend_moe.bf16_bmm(x, x)
        torch_ascend_moe.bf16_einsum("bhr,hdr->bhd", x, w)
    assert counter.get_total_flops() == 2 * 8 * 16 * 32 + 2 * 3 * 4 * 4 * 16 + 2 * 3 * 4 * 16 * 8


def test_import_leaves_flop_counter_and_triton_unloaded_until_used():
    """``torch.utils.flop_counter`` imports Triton at its top (75 MiB where Triton is installed): the package
    registers its FLOP formulas when that module is first imported, by whoever imports it, not before."""
    code = (
        "import sys, torch, torch_ascend_moe\n"
        "print('triton' in sys.modules, 'torch.utils.flop_counter' in sys.modules)\n"
        "from torch.utils.flop_counter import FlopCounterMode\n"
        "a, b = torch.randn(8, 32, dtype=torch.bfloat16), torch.randn(16, 32, dtype=torch.bfloat16)\n"
        "with FlopCounterMode(display=False) as counter:\n"
        "    torch_ascend_moe.bf16_gemm(a, b)\n"
        "print(counter.get_total_flops())\n"
    )
    result = _python("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", str(2 * 8 * 16 * 32)]


def test_cli_info_json():
    result = _python("-m", "torch_ascend_moe", "info", "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["build"]["torch"] == torch.__version__
    assert sorted(info["ops"]) == OPS
    assert all(info["ops"][n]["CPU"] and info["ops"][n]["autograd"] for n in OPS)
    chains = info["chains"]
    assert sorted(chains) == OPS
    for op, per_device in chains.items():  # every chain ends with the portable kernel; on CPU the C++ one leads
        assert all(labels[-1] == "portable" for labels in per_device.values()), (op, per_device)
        assert per_device["cpu"][0].startswith("cpp") or per_device["cpu"] == ["portable"], (op, per_device["cpu"])
    assert chains["fp8_gemm"]["cuda"][:2] == ["deep_gemm.fp8_fp4_gemm_nt", "triton: _scaled_gemm"]


def test_cli_info_table_and_bench(tmp_path):
    table = _python("-m", "torch_ascend_moe", "info")
    assert table.returncode == 0 and "bf16_gemm" in table.stdout and "autograd" in table.stdout
    # piped (not a terminal): every op name whole, so that `info | grep NAME` finds each
    cells = {line.split("│")[1].strip() for line in table.stdout.splitlines() if line.count("│") > 2}
    assert set(OPS) <= cells, sorted(set(OPS) - cells)
    out = tmp_path / "bench.json"
    bench = _python("-m", "torch_ascend_moe", "bench", "gemm", "--quick", "--min-run-time", "0.02", "--json", str(out))
    assert bench.returncode == 0, bench.stderr
    assert "speedup" in bench.stdout
    run = json.loads(out.read_text())
    assert run["command"].startswith("python -m torch_ascend_moe bench gemm --quick")
    assert run["machine"]["cpu_count"] == os.cpu_count() and run["machine"]["torch"] == torch.__version__
    rows = run["results"]
    from torch_ascend_moe.bench import gemm

    assert [r["case"] for r in rows] == [c.name for c in gemm.cases(quick=True)]
    assert all(r["ours_ms"] > 0 and r["baseline_ms"] > 0 and r["speedup"] > 0 for r in rows)


def test_cli_bench_threads(tmp_path):
    """``--threads 1,2``: one table per thread count, each result recorded with its count."""
    out = tmp_path / "bench.json"
    args = ("bench", "gemm", "--quick", "--min-run-time", "0.02", "--threads", "1,2", "--json", str(out))
    bench = _python("-m", "torch_ascend_moe", *args)
    assert bench.returncode == 0, bench.stderr
    assert "1 CPU threads" in bench.stdout and "2 CPU threads" in bench.stdout
    rows = json.loads(out.read_text())["results"]
    assert sorted({r["threads"] for r in rows}) == [1, 2] and len(rows) % 2 == 0
    bad = _python("-m", "torch_ascend_moe", "bench", "gemm", "--threads", "0")
    assert bad.returncode != 0 and "--threads expects positive integers" in bad.stderr


def test_cli_bench_busy(tmp_path):
    """``--busy``: every case timed idle and again with another process spinning on one core, side by side; the busy
    rows recorded with ``"busy": true``, and no spinner left behind."""
    out = tmp_path / "bench.json"
    bench = _python("-m", "torch_ascend_moe", "bench", "gemm", "--quick", "--min-run-time", "0.02", "--busy", "--json",
                    str(out))  # fmt: skip
    assert bench.returncode == 0, bench.stderr
    assert "idle and with one core busy" in bench.stdout and "kept" in bench.stdout
    rows = json.loads(out.read_text())["results"]
    idle, busy = [r for r in rows if not r.get("busy")], [r for r in rows if r.get("busy")]
    assert [r["case"] for r in idle] == [r["case"] for r in busy] and idle


def test_busy_core_runs_a_spinner_only_inside_the_block():
    import time

    from torch_ascend_moe import bench as bench_module

    def cpu_ticks(pid: int) -> int:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    with bench_module.busy_core() as spinner:
        assert spinner.poll() is None
        start = cpu_ticks(spinner.pid)
        time.sleep(0.5)
        assert cpu_ticks(spinner.pid) - start >= 20  # busy: at least 0.2 s of CPU in 0.5 s (100 ticks per second)
    assert spinner.poll() is not None


def test_cli_rejects_unknown_family():
    result = _python("-m", "torch_ascend_moe", "bench", "nope")
    assert result.returncode != 0 and "invalid choice" in result.stderr


def test_exported_graph_is_stable():
    """Golden FX graph of a linear layer on bf16_gemm: the op appears once, with its arguments."""

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(8, 16, dtype=torch.bfloat16))

        def forward(self, x, bias):
            return torch_ascend_moe.bf16_gemm(x, self.weight, bias, alpha=0.5, out_dtype=torch.float32)

    ep = torch.export.export(Linear(), (torch.randn(4, 16, dtype=torch.bfloat16), torch.randn(4, 8)))
    assert_expected_inline(
        str(ep.graph_module.code).strip(),
        """\
def forward(self, p_weight, x, bias):
    bf16_gemm = torch.ops.ascend_moe.bf16_gemm.default(x, p_weight, bias, 0.5, torch.float32);  x = p_weight = bias = None
    return (bf16_gemm,)""",
    )


@pytest.mark.skipif(not (Path(__file__).parents[2] / "shared/tools/op_audit.py").exists(), reason="no ../shared")
def test_op_audit_passes():
    """The project's own op-contract audit (../shared/tools/op_audit.py) finds nothing missing."""
    root = Path(__file__).parents[1]
    result = _python(str(root.parent / "shared/tools/op_audit.py"), cwd=root)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_clean():
    """Style is part of the contract (design §8): ruff lint and format find nothing."""
    ruff = pytest.importorskip("ruff")
    root = Path(__file__).parents[1]
    binary = Path(ruff.find_ruff_bin())
    for args in (["check", "."], ["format", "--check", "."]):
        result = subprocess.run([str(binary), *args], cwd=root, capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stdout + result.stderr


def test_console_script():
    script = Path(sys.executable).parent / "torch-ascend-moe"
    if not script.exists():
        pytest.skip("package not installed with its console script in this environment")
    result = subprocess.run([str(script), "info", "--json"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and sorted(json.loads(result.stdout)["ops"]) == OPS, result.stderr


def test_arguments_by_name_fill_the_schema_defaults():
    """Autograd reads arguments by name (``_registry.arguments``), with the schema's defaults for trailing ones a
    caller dropped, and returns one gradient per schema argument (``_registry.gradients``)."""
    from torch_ascend_moe import _registry

    x, idx = torch.zeros(2, 4), torch.zeros(2, 1, dtype=torch.int64)
    args = _registry.arguments("ep_dispatch", (x, None, idx, None, 4, "g"))
    assert args.x is x and args.group_name == "g" and args.expert_alignment == 1 and args.num_worst_tokens == 0
    assert args.timeout_s == torch.ops.ascend_moe.ep_dispatch.default._schema.arguments[-1].default_value
    assert _registry.arguments("ep_dispatch", (x, None, idx, None, 4, "g", 8, 16, 5.0)).timeout_s == 5.0
    with pytest.raises(TypeError, match="missing argument 'group_name'"):
        _registry.arguments("ep_dispatch", (x, None, idx, None, 4))
    grads = _registry.gradients("ep_combine", x=x, bias_1=idx)
    assert len(grads) == len(torch.ops.ascend_moe.ep_combine.default._schema.arguments)
    assert grads[0] is x and grads[3] is idx and all(g is None for i, g in enumerate(grads) if i not in (0, 3))
    with pytest.raises(TypeError, match="no argument"):
        _registry.gradients("ep_combine", y=x)


def _python_calls(fn) -> list[str]:
    """The Python functions (``module:function``) entered while ``fn()`` runs, beyond the lambda and
    ``OpOverload.__call__`` themselves."""
    calls = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name not in ("<lambda>", "__call__"):
            calls.append(f"{frame.f_globals.get('__name__')}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


def test_a_call_without_gradients_runs_no_python_autograd():
    """The Autograd-key kernel is C++: under no_grad, or with no input requiring grad, an op with a C++ CPU
    kernel enters no Python at all; with a gradient needed it runs torch.library's autograd implementation."""
    op = torch.ops.ascend_moe.bf16_gemm.default
    a, b = torch.randn(2, 8), torch.randn(3, 8)
    assert _python_calls(lambda: op(a, b)) == []
    a.requires_grad_()
    with torch.no_grad():
        assert _python_calls(lambda: op(a, b)) == []
    calls = _python_calls(lambda: op(a, b))
    assert any(c.startswith("torch._library.autograd:") for c in calls), calls


def _restated_schema_defaults(path: Path) -> list[str]:
    """Parameters of the op-named (or registry-decorated) functions in ``path`` whose default restates a schema
    default instead of leaving it to the schema (``with_defaults``) or reading it (``FROM_SCHEMA``)."""
    import ast

    from torch_ascend_moe._registry import _schema, op_names

    ops = set(op_names())
    found = []
    for node in ast.parse(path.read_text()).body:
        if not isinstance(node, ast.FunctionDef):
            continue
        named = [
            d.args[0].value
            for d in node.decorator_list
            if isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant)
        ]
        op = next((n for n in [*named, node.name] if isinstance(n, str) and n in ops), None)
        if op is None:
            continue
        defaults = {arg: d for arg, has, d in _schema(op) if has and d is not None}
        a = node.args
        positional = a.posonlyargs + a.args
        pairs = [*zip(positional[len(positional) - len(a.defaults) :], a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
        for arg, default in pairs:
            if arg.arg in defaults and isinstance(default, (ast.Constant, ast.Tuple, ast.List)):
                found.append(f"{path.name}:{node.lineno} {node.name}({arg.arg}={ast.unparse(default)})")
    return found


def test_no_schema_default_is_restated():
    """Defaults live in the schema only: wrappers take them with FROM_SCHEMA, kernels/fakes/formulas get every
    argument from the dispatcher (``_registry.with_defaults``)."""
    root = Path(torch_ascend_moe.__file__).parent
    files = [
        p for d in ("ops", "fakes", "checks", "flops", "backends/portable") for p in sorted((root / d).glob("*.py"))
    ]
    assert files
    assert [f for p in files for f in _restated_schema_defaults(p)] == []


def test_compile_caches_are_tagged_with_what_graphs_bake_in(monkeypatch):
    """Inductor's and AOTAutograd's caches key on the graph, not on our schemas, fakes or backward formulas: the
    import adds a hash of those to torch.compiler.config.cache_key_tag (a user's own tag kept), so a graph
    compiled under another version of them is never served."""
    from torch_ascend_moe import _registry

    tag = _registry.compile_cache_tag()
    assert tag in torch.compiler.config.cache_key_tag.split("|")
    # The config's own patch restores it (a monkeypatched config attribute is deleted on undo, breaking compiles).
    with torch.compiler.config.patch(cache_key_tag="mine|ascend_moe-0123456789abcdef"):
        _registry.tag_compile_caches()
        assert torch.compiler.config.cache_key_tag == f"mine|{tag}"  # a stale tag of ours replaced, the user's kept
    assert tag in torch.compiler.config.cache_key_tag.split("|")
    monkeypatch.setattr(_registry, "_GRAPH_SOURCES", ("fakes",))
    assert _registry.compile_cache_tag() != tag  # the formulas are part of it


def test_install_as_resolves_upstream_module_paths():
    """``testing.upstream.install_as`` (the upstream-test tools): ``import <name>.sub`` finds our submodule."""
    import importlib
    import sys

    import torch_ascend_moe.deep_gemm as dg
    from torch_ascend_moe.testing.upstream import install_as

    name = "deep_gemm_install_as_check"
    try:
        install_as(dg, name)
        assert importlib.import_module(name) is dg
        assert importlib.import_module(f"{name}.testing") is importlib.import_module(
            "torch_ascend_moe.deep_gemm.testing"
        )
        assert importlib.import_module(f"{name}.utils.math").ceil_div(5, 2) == 3
    finally:
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]
