"""hc_prenorm_gemm through the op-contract harness (torch_ascend_moe.testing.harness)."""

from torch_ascend_moe.testing.harness import contract_test
from torch_ascend_moe.testing.hc_prenorm import SPECS

test_op_contract = contract_test(SPECS)
