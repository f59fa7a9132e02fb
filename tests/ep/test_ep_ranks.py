"""The ep family on 2 and 4 gloo ranks in spawned processes (tests.distributed.ep_bodies.rank_checks): DeepEP's
validation strategies (value-encoded sources, all_reduce count cross-checks, all_gather references, bitwise
combine, -1 slots, uneven token counts, alignment 1 and 128, 0/1/2 biases, FP8 rows, static-capacity prefix
equality), gradients against one process running every expert, compile fullgraph forward+backward (2 ranks), bad input
on one rank raising on all, and the timeout path; each on both row transports (shared memory, gloo sockets)."""

import pytest
import torch.multiprocessing as mp

from tests.distributed.ep_bodies import rank_checks


@pytest.mark.parametrize("transport", ["shared memory", "sockets"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_ep_on_ranks(world_size, transport, tmp_path, monkeypatch):
    # Ranks of one host move rows through shared memory unless told not to: "sockets" checks gloo's transport.
    monkeypatch.setenv("TORCH_ASCEND_MOE_EP_SHM", "1" if transport == "shared memory" else "0")
    mp.spawn(rank_checks, args=(world_size, str(tmp_path / "store")), nprocs=world_size, join=True)
