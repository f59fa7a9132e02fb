"""The ep family through the op-contract harness, on a one-rank gloo group (multi-rank: test_ep_ranks.py)."""

from tests.ep.specs import SPECS
from torch_ascend_moe.testing.harness import contract_test

test_op_contract = contract_test(SPECS)
