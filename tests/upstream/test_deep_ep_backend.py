"""The ep ops through DeepEP's V1 kernels (``backends/upstream/deep_ep/legacy.py``) on 2 and 4 gloo ranks, with the
stand-in ``deep_ep`` (``tests/standins/deep_ep``, written from DeepEP's sources) installed in every rank: what
reaches it, bitwise equality with our transport (rows, handle, combine with 0/1/2 biases, cached dispatch, FP8
rows, static capacity), gradients, a compiled graph, reasons and refusals, and a rank without DeepEP raising on
every rank (tests.distributed.deep_ep_backend_bodies)."""

import pytest
import torch.multiprocessing as mp

from tests.distributed import run_named
from tests.distributed.deep_ep_backend_bodies import CHECKS


def _run(rank, world_size, store, names):
    import torch.distributed as dist

    from tests.distributed import deep_ep_backend_bodies as bodies

    def all_checks(rank, world_size):
        for name in names:
            bodies.CHECKS[name](rank, world_size)
            dist.barrier()

    run_named({"all": all_checks}, rank, world_size, store, "all", timeout_s=120)


@pytest.mark.parametrize("world_size", [2, 4])
def test_deep_ep_backend(world_size, tmp_path):
    names = list(CHECKS) if world_size == 2 else ["dispatch_combine", "refusals", "low_latency"]
    mp.spawn(_run, args=(world_size, str(tmp_path / "store"), names), nprocs=world_size, join=True)
