"""``bench cuda``'s cases (run on a lent GPU by tools/device_check.sh) exercised on CPU tensors here, so a GPU
session never spends its minutes on a broken case: each case's two sides compute the same thing (our op and its
baseline agree), and without CUDA the CLI says there is nothing to time."""

from __future__ import annotations

import pytest
import torch

from torch_ascend_moe.bench import cuda as cases_module
from torch_ascend_moe.cli import main
from torch_ascend_moe.testing import calc_diff


@pytest.fixture
def on_cpu(monkeypatch):
    def bf16(*shape, seed=0):
        return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).bfloat16()

    monkeypatch.setattr(cases_module, "_device", lambda: torch.device("cpu"))
    monkeypatch.setattr(cases_module, "_bf16", bf16)


@pytest.mark.parametrize(
    "case",
    [
        lambda m: m._gemm(8, 16, 128),
        lambda m: m._gemm_fp32_out(8, 16, 128),
        lambda m: m._fp8_gemm(8, 256, 256),
        lambda m: m._fp8_gemm(8, 320, 256),  # N in a partial 128-row block, as the bench's 2112
        lambda m: m._grouped(2, 8, 256, 256),
        lambda m: m._grouped_fp8(2, 8, 256, 256),
        lambda m: m._mqa(8, 32, 4, 64),
        lambda m: m._moe(16, 64, 2, 4),
    ],
    ids=["gemm", "gemm fp32 out", "fp8_gemm", "fp8_gemm partial block", "grouped", "grouped fp8", "mqa", "moe"],
)
def test_each_case_times_two_equal_computations(on_cpu, case):
    ours, baseline = case(cases_module).setup()
    a, b = ours().float(), baseline().float()
    assert a.shape == b.shape
    finite = torch.isfinite(b)
    assert torch.equal(torch.isfinite(a), finite) and calc_diff(a[finite], b[finite]) < 1e-4


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU times the cases")
def test_without_cuda_nothing_is_timed(capsys):
    assert main(["bench", "cuda", "--quick"]) == 0
    assert "nothing to time" in capsys.readouterr().out
