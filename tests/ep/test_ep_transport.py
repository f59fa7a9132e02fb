"""The rows under the ep ops travel through shared memory between ranks of one host and point to point over
gloo's sockets otherwise: both give the all_gather reference's rows on 2 and 3 spawned ranks, regions grow
and fall back together (tests.distributed.transport_bodies). The whole ep check suite on the socket transport
is tests/ep/test_ep_ranks.py's ``sockets`` cases. The headers and small all-reduces of ranks of one host go
through shared control blocks: same results as gloo's collectives, bounded waits that name the missing rank."""

import os

import pytest
import torch.multiprocessing as mp

from tests.distributed.transport_bodies import control_checks, transport_checks

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm on this host")


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("case", ["grow", "no space", "other host"])
def test_transports(world, case, tmp_path):
    mp.spawn(transport_checks, args=(world, str(tmp_path / "store"), case), nprocs=world, join=True)


def test_control_blocks(tmp_path):
    mp.spawn(control_checks, args=(2, str(tmp_path / "store")), nprocs=2, join=True)
