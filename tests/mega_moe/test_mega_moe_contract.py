"""mega_moe through the op-contract harness (torch_ascend_moe.testing.harness)."""

from tests.mega_moe.specs import SPECS
from torch_ascend_moe.testing.harness import contract_test

test_op_contract = contract_test(SPECS)
