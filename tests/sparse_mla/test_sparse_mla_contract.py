"""sparse_mla_prefill through the op-contract harness (torch_ascend_moe.testing.harness)."""

from tests.sparse_mla.specs import SPECS
from torch_ascend_moe.testing.harness import contract_test

test_op_contract = contract_test(SPECS)
