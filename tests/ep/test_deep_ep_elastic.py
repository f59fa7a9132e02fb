"""``torch_ascend_moe.deep_ep.ElasticBuffer`` (DeepEP V2 / DeepEP-Ascend) on spawned gloo ranks: DeepEP's own V2
test (``tests/elastic/test_ep.py``) on CPU in several configurations, bad input on one rank, the experimental
APIs, autograd and compile (tests.distributed.elastic_bodies)."""

import pytest
import torch.multiprocessing as mp

from tests.distributed.elastic_bodies import run_check

CASES = [
    ("upstream_test_ep", 2, None),
    ("upstream_test_ep_no_sync_no_multiple_reduction", 2, None),
    ("upstream_test_ep_deterministic_masked", 4, None),
    # Two emulated nodes of two ranks: hybrid mode's per-domain reduction and scale-up grouping.
    ("upstream_test_ep_deterministic_masked", 4, {"TORCH_ASCEND_MOE_EP_RANKS_PER_NODE": "2"}),
    ("combine_adds_in_slot_order", 2, None),
    ("fp8_ue8m0_packs", 2, None),
    ("bad_input_fails_every_rank", 2, None),
    ("experimental", 2, None),
    ("autograd_expand_gemm_combine", 2, None),
    ("autograd_expand_gemm_combine", 4, None),
    ("compile_v2_moe", 2, None),
    ("deepep_25_split", 2, None),
]


@pytest.mark.parametrize(
    ("name", "ranks", "env"), CASES, ids=[f"{n}-{r}ranks{'-hybrid' if e else ''}" for n, r, e in CASES]
)
def test_elastic_buffer(name, ranks, env, tmp_path):
    mp.spawn(run_check, args=(ranks, str(tmp_path / "store"), name, env), nprocs=ranks, join=True)
