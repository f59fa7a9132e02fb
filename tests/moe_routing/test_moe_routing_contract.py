"""Every moe_routing-family op through the op-contract harness (torch_ascend_moe.testing.harness)."""

from torch_ascend_moe.testing.harness import contract_test
from torch_ascend_moe.testing.moe_routing import SPECS

test_op_contract = contract_test(SPECS)
