"""The ep ops through DeepEP's V2 ``ElasticBuffer`` (``backends/upstream/deep_ep/elastic.py``) on CUDA and Ascend
chains, 2 and 3 gloo ranks (3: a group V1 refuses, so V2 is chosen with V1 installed), with the stand-in ``deep_ep``
(``tests/standins/deep_ep``: V2 written from DeepEP's sources, DeepEP-Ascend's limits as its Ascend flavour)
installed in every rank: bitwise equality with our transport, what reaches it, gradients, a compiled graph,
reasons, bad input, mutations (tests.distributed.deep_ep_elastic_backend_bodies)."""

import pytest
import torch.multiprocessing as mp

from tests.distributed import run_named
from tests.distributed.deep_ep_elastic_backend_bodies import CHECKS


def _run(rank, world_size, store, names):
    import torch.distributed as dist

    from tests.distributed import deep_ep_elastic_backend_bodies as bodies

    def all_checks(rank, world_size):
        for name in names:
            bodies.CHECKS[name](rank, world_size)
            dist.barrier()

    run_named({"all": all_checks}, rank, world_size, store, "all", timeout_s=120)


@pytest.mark.parametrize("world_size", [2, 3])
def test_deep_ep_elastic_backend(world_size, tmp_path):
    names = list(CHECKS) if world_size == 2 else ["dispatch_combine", "refusals", "gradients"]
    mp.spawn(_run, args=(world_size, str(tmp_path / "store"), names), nprocs=world_size, join=True)
