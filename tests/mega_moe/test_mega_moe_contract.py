"""mega_moe through the op-contract harness (torch_ascend_moe.testing.harness)."""

from torch_ascend_moe.testing.harness import contract_test
from torch_ascend_moe.testing.mega_moe import SPECS

test_op_contract = contract_test(SPECS)
