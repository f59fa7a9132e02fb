"""Which ops' portable kernels (what CUDA and Ascend run where no fused kernel maps) can run while a device graph
is captured: every op's first non-empty sample, run under the EP tests' sync detector (every capture check
answers yes; any host sync fails), gives the same bits as outside a capture. The ops that must read the host are
named here with the reason, so a new host sync elsewhere fails this test."""

from __future__ import annotations

import pytest
import torch

from tests._families import family_specs
from tests.distributed.ep_bodies import emulated_capture

# op -> why its portable kernel reads the host (a fused device kernel is what makes it capturable). The portable
# kernels of m_grouped_fp8_linear / m_grouped_fp8_quant_gemm are their steps through the dispatcher: capturable
# where the steps' kernels are (here the C++ ones; on CUDA the Triton cast and grouped GEMM).
HOST_BOUND = {
    "m_grouped_bf16_gemm": "one GEMM per expert segment, segments read from the layout (CUDA: torch._grouped_mm)",
    "m_grouped_bf16_gemm_masked": "one GEMM per group up to masked_m (CUDA: torch._grouped_mm)",
    "k_grouped_bf16_gemm": "one GEMM per group segment (CUDA: torch._grouped_mm)",
    "m_grouped_fp8_gemm": "one block-scaled GEMM per expert segment",
    "m_grouped_fp8_gemm_masked": "one block-scaled GEMM per group up to masked_m",
    "k_grouped_fp8_gemm": "one block-scaled GEMM per group segment",
    "paged_mqa_logits_metadata": "DeepGEMM's schedule table: host integer bookkeeping by design",
}
CASES = [
    pytest.param(spec, id=spec.name)
    for family, specs in family_specs().items()
    if family != "ep"  # the ep ops have their own capture tests (tests/ep, static paths only)
    for spec in specs
    if spec.portable is not None
]


def _sample(spec):
    for s in spec.sample_inputs("cpu", spec.dtypes[0]):
        if all(a.numel() for a in s.args if isinstance(a, torch.Tensor)):
            return s
    return None


@pytest.mark.parametrize("spec", CASES)
def test_portable_kernel_while_capturing(spec):
    s = _sample(spec)
    if s is None:
        pytest.skip("no non-empty sample")
    eager = spec.portable(*s.args)
    if spec.name in HOST_BOUND:
        with pytest.raises(AssertionError, match="host sync"):
            with emulated_capture():
                spec.portable(*s.args)
        return
    with emulated_capture():
        captured = spec.portable(*s.args)
    for e, c in zip(*(o if isinstance(o, tuple) else (o,) for o in (eager, captured)), strict=True):
        assert torch.equal(
            e.view(torch.uint8) if e.dtype.itemsize == 1 else e, c.view(torch.uint8) if c.dtype.itemsize == 1 else c
        ), spec.name
