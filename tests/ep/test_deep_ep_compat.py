"""``torch_ascend_moe.deep_ep`` (DeepEP V1 ``Buffer``) on 2 spawned gloo ranks: the V1 points of issue 16, one
spawn per check (tests.distributed.deep_ep_bodies)."""

import socket

import pytest
import torch.multiprocessing as mp

from tests.distributed.deep_ep_bodies import CHECKS, run_check, upstream_style


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_deep_ep_buffer(name, tmp_path):
    mp.spawn(run_check, args=(2, str(tmp_path / "store"), name), nprocs=2, join=True)


def test_deep_ep_utils_as_upstream_tests_use_them():
    """``deep_ep.utils`` (``math``, ``envs``, ``testing``, ``event``): a DeepEP-style test script that joins
    through ``init_dist`` (upstream's environment variables) on a free port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(upstream_style, args=(2, port), nprocs=2, join=True)
