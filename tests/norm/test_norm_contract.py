"""The norm family through the op-contract harness (torch_ascend_moe.testing.harness)."""

from tests.norm.specs import SPECS
from torch_ascend_moe.testing.harness import contract_test

test_op_contract = contract_test(SPECS)
