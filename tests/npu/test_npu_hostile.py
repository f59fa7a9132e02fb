"""The bad-input campaign's mutations (torch_ascend_moe.testing.campaign: every other dtype, ranks, sizes,
strides, int64 edges, NaN, out-of-range values) of each Ascend adapter's samples, with the adapter in the
portable kernel's place: on Ascend 950's rules (the most mappings), through our CPU references of the torch_npu
ops, each adapter gives the C++ kernel's verdict, the same whole message, and its outputs where both accept."""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.chains import npu_chain
from torch_ascend_moe.backends import chain
from torch_ascend_moe.backends.npu import fp8_gemm, grouped, moe_routing, quant
from torch_ascend_moe.testing import campaign, npu_wheel

FAMILIES = ("grouped", "moe_routing", "quant", "fp8_gemm")
CASES = [
    pytest.param(family, spec, id=spec.name)
    for family in FAMILIES
    for spec in importlib.import_module(f"tests.{family}.specs").SPECS
    if any(k.library == "torch_npu" for k in chain.chain(spec.name, "npu"))
]


@pytest.fixture
def ascend950(npu_ops, monkeypatch):
    importlib.import_module("tests.npu.grouped_refs")
    importlib.import_module("tests.npu.quant_routing_refs").register()
    monkeypatch.setitem(npu_wheel.SOC, "version", 260)
    for module in (moe_routing, quant, fp8_gemm, grouped):
        monkeypatch.setattr(module, "soc_version", lambda: 260)


@pytest.mark.parametrize(("family", "spec"), CASES)
def test_hostile_inputs_agree_with_the_cpu_kernel(family, spec, ascend950):
    dtypes = [d for d in (torch.bfloat16, torch.float32) if d in spec.dtypes]
    samples = [s for dtype in dtypes for s in spec.sample_inputs("cpu", dtype)[:3]]
    problems, count = campaign.kernel_problems(spec, getattr(npu_chain, spec.name), samples)
    assert count and not problems, "\n".join(problems[:5])
