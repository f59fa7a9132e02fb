"""rotary_embedding through the op-contract harness (torch_ascend_moe.testing.harness)."""

from tests.rope.specs import SPECS
from torch_ascend_moe.testing.harness import contract_test

test_op_contract = contract_test(SPECS)
