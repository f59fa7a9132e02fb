"""Kernel choice as data (backends/chain.py): chains ordered by tier, one lookup, the switches, ``explain`` and the
``info --explain`` command, recording and ``warmup``, ``on_cpu``; and no kernel body that falls back by itself."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tests.chains  # noqa: F401  (every device's kernels declared)
from tests.fp8_gemm.specs import SPECS as FP8_SPECS
from torch_ascend_moe import _registry, backends
from torch_ascend_moe.backends import chain, explain

ROOT = Path(__file__).resolve().parents[1]
FP8 = next(s for s in FP8_SPECS if s.name == "fp8_gemm")


def test_every_chain_is_ordered_by_tier_and_ends_with_the_portable_kernel():
    for device in ("cuda", "npu"):
        for op in chain.ops_with_kernels(device):
            kernels = chain.chain(op, device)
            tiers = [chain.TIERS.index(k.tier) for k in kernels]
            assert tiers == sorted(tiers), (op, device, [k.label for k in kernels])
            assert kernels[-1].library == "portable" and kernels[-1].run is _registry.PORTABLE[op]


def test_disabling_skips_a_library_or_one_ops_kernel(monkeypatch):
    s = FP8.sample_inputs("cpu", torch.bfloat16)[1]
    args = _registry.full_call("fp8_gemm", *s.args)
    assert chain.choose("fp8_gemm", "cuda", args).library == "triton"
    with chain.disabled("triton"):
        assert chain.choose("fp8_gemm", "cuda", args).library == "portable"
        with chain.disabled("deep_gemm"):  # nested blocks add up
            assert {"triton", "deep_gemm"} <= chain.disabled_names()
    assert chain.disabled_names() == frozenset()
    monkeypatch.setenv(chain.ENV, "fp8_gemm:triton, deep_ep")
    assert chain.choose("fp8_gemm", "cuda", args).library == "portable"
    assert chain.choose("fp8_bmm", "cuda", _bmm_args()).library == "triton"  # only fp8_gemm's kernel is off


def _bmm_args():
    s = next(s for s in FP8_SPECS if s.name == "fp8_bmm").sample_inputs("cpu", torch.bfloat16)[1]
    return _registry.full_call("fp8_bmm", *s.args)


@pytest.mark.parametrize(
    ("names", "match"),
    [("fp8_gem:triton", "cannot disable 'fp8_gem:triton'"), ("cublas", "cannot disable 'cublas'"),
     ("portable", "cannot disable 'portable'")],
)  # fmt: skip
def test_a_switch_naming_nothing_is_an_error(names, match, monkeypatch):
    with pytest.raises(ValueError, match=match):
        with chain.disabled(*names.split(",")):
            pass
    monkeypatch.setenv(chain.ENV, names)
    with pytest.raises(ValueError, match=f"{chain.ENV}: {match}"):
        chain.disabled_names()


def test_explain_says_why_each_kernel_refused():
    s = FP8.sample_inputs("cpu", torch.bfloat16)[1]  # 1x128 x 1x128 UE8M0: the Triton kernel's
    steps = chain.explain("fp8_gemm", "cuda", *s.args)
    assert [st.status for st in steps] == ["not available", "chosen", "not asked"]
    assert "deep_gemm is not installed" in steps[0].reason
    with chain.disabled("triton"):
        steps = chain.explain("fp8_gemm", "cuda", *s.args)
    assert [st.status for st in steps] == ["not available", "disabled", "chosen"]
    cpu = chain.explain("fp8_gemm", "cpu", *s.args)
    assert cpu[0].kernel.library == "cpp" and cpu[0].status == "chosen"


def test_explain_reports_the_ops_own_error_for_a_bad_call():
    bad = FP8.bad_inputs("cpu")[0]
    text = explain.report("fp8_gemm", "cuda", _registry.full_call("fp8_gemm", *bad.args))
    assert "the op refuses the call: ascend_moe::fp8_gemm: argument" in text


def _info(*args):
    return subprocess.run(
        [sys.executable, "-m", "torch_ascend_moe", "info", *args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


def test_info_explain_from_text_and_from_a_saved_call(tmp_path):
    text = "float8_e4m3fn[128,256] float32[128,2] float8_e4m3fn[264,256] float32[3,2]"
    result = _info("--explain", "fp8_gemm", "--device", "cuda", "--args", text)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.search(r"1\. deep_gemm\.fp8_fp4_gemm_nt\s+not available: deep_gemm is not installed", result.stdout)
    assert len(lines) == 5 and sum("chosen" in line for line in lines) == 1, result.stdout
    s = FP8.sample_inputs("cpu", torch.bfloat16)[0]
    path = tmp_path / "call.pt"
    explain.save_call(str(path), "fp8_gemm", *s.args)
    saved = _info("--explain", "fp8_gemm", "--device", "npu", "--call", str(path))
    assert saved.returncode == 0 and "torch_npu: npu_quant_matmul" in saved.stdout, saved.stdout + saved.stderr
    bad = _info("--explain", "fp8_gemm", "--args", "float9[2,2]")
    assert bad.returncode == 2 and "unknown dtype 'float9'" in bad.stdout


def test_recording_and_warmup_name_the_kernels_chosen():
    s = FP8.sample_inputs("cpu", torch.bfloat16)[1]
    with chain.on_cpu("cuda"):
        kernels = chain.warmup(torch.ops.ascend_moe.fp8_gemm, *s.args)
    assert [k.label for k in kernels] == ["triton: _scaled_gemm"]
    with chain.recording() as choices:
        torch.ops.ascend_moe.fp8_gemm(*s.args)  # CPU: the dispatcher's C++ kernel, no chain
    assert choices == []


def test_on_cpu_runs_every_op_on_the_devices_chain_and_restores_the_cpu_kernels():
    s = FP8.sample_inputs("cpu", torch.bfloat16)[1]
    with chain.recording() as choices, chain.on_cpu("cuda"):
        torch.ops.ascend_moe.fp8_linear(torch.randn(4, 128), torch.randn(8, 128))  # no CUDA kernel: its portable
        torch.ops.ascend_moe.fp8_gemm(*s.args)
    assert [k.label for k in choices] == ["portable", "triton: _quant", "triton: _quant", "triton: _scaled_gemm"] + [
        "triton: _scaled_gemm"
    ]
    with chain.recording() as choices:
        torch.ops.ascend_moe.fp8_gemm(*s.args)
    assert choices == []


# Kernel bodies that call a portable kernel as a piece of their own computation, not as a fallback: the portable
# selection over the Triton kernel's logits; cuBLAS's FP32 accumulator through the portable GEMM's native variant.
_COMPOSED = {("cuda/mqa_logits.py", "mqa_logits_topk")}
_COMPOSED |= {("cuda/gemm.py", op) for op in ("bf16_gemm", "bf16_bmm", "bf16_einsum")}


def test_no_device_kernel_falls_back_by_itself():
    """A device kernel never calls its op's portable kernel to hand a call on: that is the chain's job (``takes``)."""
    ops = set(_registry.op_names())
    found = []
    for folder in ("cuda", "npu", "upstream"):
        for path in sorted((ROOT / "torch_ascend_moe" / "backends" / folder).rglob("*.py")):
            rel = str(path.relative_to(ROOT / "torch_ascend_moe" / "backends"))
            for op in re.findall(r"\bportable\.(\w+)\(", path.read_text()):
                if op in ops and (rel, op) not in _COMPOSED:
                    found.append(f"{rel}: portable.{op}(...)")
    assert not found, found


def test_a_planned_kernel_makes_its_plan_once_per_call():
    """``planned``: the body gets the plan its ``takes`` made for the same argument objects (host reads are not
    repeated), a fresh one for other objects, each plan once; a refused call leaves no plan behind."""
    made = []

    def plan(x, n):
        made.append(n)
        return "too small" if n < 0 else [x, n]

    takes = chain.planned(plan)
    x, other = torch.ones(2), torch.ones(2)
    assert takes(x, 3).ok
    first = takes.result(x, 3)
    assert first[0] is x and made == [3]
    assert takes.result(x, 3) is not first and made == [3, 3]  # handed out once
    assert takes(x, 4).ok and takes.result(other, 4)[0] is other and made == [3, 3, 4, 4]
    assert takes(x, -1) == chain.refuse("too small")
    with pytest.raises(RuntimeError, match=r"plan: the kernel ran on a call it refuses \(too small\)"):
        takes.result(x, -1)


def test_every_library_has_a_tier_and_every_kernel_a_known_library():
    assert set(chain.LIBRARIES.values()) <= set(chain.TIERS)
    backends.register_all()
    for device in ("cuda", "npu"):
        for op in chain.ops_with_kernels(device):
            assert all(k.library in chain.LIBRARIES for k in chain.chain(op, device))
