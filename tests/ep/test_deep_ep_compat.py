"""``torch_ascend_moe.deep_ep`` (DeepEP V1 ``Buffer``) on 2 spawned gloo ranks: the V1 points of issue 16, one
spawn per check (tests.distributed.deep_ep_bodies)."""

import pytest
import torch.multiprocessing as mp

from tests.distributed.deep_ep_bodies import CHECKS, run_check


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_deep_ep_buffer(name, tmp_path):
    mp.spawn(run_check, args=(2, str(tmp_path / "store"), name), nprocs=2, join=True)
