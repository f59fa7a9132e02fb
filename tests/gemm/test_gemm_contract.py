"""Every gemm-family op through the op-contract harness (torch_ascend_moe.testing.harness)."""

import pytest

from torch_ascend_moe.testing import harness
from torch_ascend_moe.testing.gemm import SPECS


@pytest.mark.parametrize("device", harness.devices())
@pytest.mark.parametrize(
    "check",
    [pytest.param(n, marks=pytest.mark.slow) if n in harness.SLOW_CHECKS else n for n in harness.CHECKS],
)
@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_op_contract(spec, check, device, tmp_path):
    harness.CHECKS[check](spec, device, tmp_path)
