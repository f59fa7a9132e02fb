"""The fp8_linear family on Ascend (backends/npu/fp8_linear.py): no kernel of its own; the portable kernels' steps
go through the dispatcher, here with CPU tensors on the NPU chains (``chain.on_cpu("npu")``, as NPU tensors would
run) and our CPU references of torch_npu's ops: values vs the portable kernel, and which samples reach
npu_quant_matmul."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from tests.chains import labels
from tests.fp8_linear.specs import SPECS
from tests.npu import quant_routing_refs
from torch_ascend_moe.backends import chain
from torch_ascend_moe.backends.npu import fp8_gemm as npu_fp8_gemm
from torch_ascend_moe.backends.npu import quant as npu_quant
from torch_ascend_moe.testing import calc_diff, npu_wheel
from torch_ascend_moe.testing.harness import THRESHOLDS

ADAPTED = [s for s in SPECS if s.name in ("fp8_quant_gemm", "fp8_linear")]
A3, ASCEND950 = 250, 260


@pytest.fixture(params=[A3, ASCEND950], ids=["A3", "Ascend950"])
def soc(request, npu_ops, monkeypatch):
    quant_routing_refs.register()
    monkeypatch.setitem(npu_wheel.SOC, "version", request.param)
    for module in (npu_quant, npu_fp8_gemm):
        monkeypatch.setattr(module, "soc_version", lambda: request.param)
    return request.param


def test_both_ops_run_their_steps():
    """No kernel of their own on Ascend: the portable kernel, whose steps reach the casts' and the GEMM's chains."""
    assert {s.name for s in ADAPTED} == {"fp8_quant_gemm", "fp8_linear"}
    for spec in ADAPTED:
        assert labels(spec.name, "npu") == ["portable"]


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_values_and_mapping(spec, soc):
    """Within the family's thresholds of the portable kernel (bitwise where no torch_npu GEMM ran: the casts are
    the same on every path); the G-B GEMM runs exactly for DeepSeek-V3's recipe to BF16 on Ascend 950."""
    reached = 0
    for dtype in spec.dtypes:
        for s in spec.sample_inputs("cpu", dtype):
            where = f"{spec.name}[{s.name}, {dtype}, soc {soc}]"
            with mock.patch.object(torch.ops.npu, "npu_quant_matmul", wraps=torch.ops.npu.npu_quant_matmul) as qmm:
                with chain.on_cpu("npu"):
                    out = spec.op(*s.args)
            with chain.on_cpu("npu"), chain.disabled("torch_npu"):  # every step its portable kernel
                ours = spec.op(*s.args)
            assert out.shape == ours.shape and out.dtype == ours.dtype, where
            if qmm.called:
                reached += 1
                assert soc >= ASCEND950, where
                assert calc_diff(out, ours) < THRESHOLDS[out.dtype], where
            else:
                assert torch.equal(out, ours), f"{where}: not bitwise the portable kernel's"
    assert reached or soc < ASCEND950, f"{spec.name}: no sample reached npu_quant_matmul on Ascend 950"
