"""The row transports under the ep ops (``distributed.transport.all_to_all_rows``), checked on each rank of spawned
gloo processes by tests/ep/test_ep_transport.py: shared-memory regions (same host) and point-to-point sockets
give every rank exactly the rows an all_gather reference says, through region growth, padding rows, odd row
widths and empty splits; a rank that cannot set up its region makes every rank fall back; a group spanning
hosts never uses regions; no file is left in /dev/shm."""

from __future__ import annotations

import datetime
import os
import traceback

import torch
import torch.distributed as dist

OP = "transport test"
WIDTH = 512  # BF16 x columns: rows of 1 KiB, so the regions grow past their 1 MiB minimum


def _our_files(token: str) -> list[str]:
    return [f for f in os.listdir("/dev/shm") if token in f]


def _round(rank: int, world: int, rows_per_rank: int, seed: int, padded: bool):
    """This rank's send rows, index and the agreed [R, R] split table (every rank draws every rank's splits)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, rows_per_rank + 1, (world, world), generator=g)
    table[0, world - 1] = 0  # an empty split
    mine = torch.Generator().manual_seed(seed * 100 + rank)
    t = rows_per_rank + rank + 1
    x = torch.randn(t, WIDTH, generator=mine).bfloat16()
    meta = torch.randint(0, 255, (t, 5), dtype=torch.uint8, generator=mine)  # 5 bytes: not a word multiple
    index = torch.randint(0, t, (int(table[rank].sum()),), generator=mine)
    if padded:
        index[::3] = -1
    return x, meta, index, table


def _expected(rank: int, world: int, everyone, table):
    xs, metas = [], []
    for s, (x, meta, index) in enumerate(everyone):
        begin = int(table[s, :rank].sum())
        sel = index[begin : begin + int(table[s, rank])]
        keep = (sel >= 0).unsqueeze(1)
        xs.append(torch.where(keep, x[sel.clamp(min=0)], 0))
        metas.append(torch.where(keep, meta[sel.clamp(min=0)], 0))
    return torch.cat(xs), torch.cat(metas)


def _exchange(group, x, meta, index, table, padded: bool, shared: bool):
    from torch_ascend_moe.distributed import transport

    rank = group.rank()
    rows = int(table[:, rank].sum())
    out_x, out_meta = x.new_empty(rows, x.shape[1]), meta.new_empty(rows, meta.shape[1])
    transport.all_to_all_rows(
        OP,
        group,
        [(out_x, x), (out_meta, meta)],
        table[:, rank].tolist(),
        table[rank].tolist(),
        30.0,
        index=index,
        padded=padded,
        send_rows=table if shared else None,
    )
    return out_x, out_meta


def transport_checks(rank: int, world: int, store_path: str, case: str) -> None:
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    from torch_ascend_moe.distributed import shared_rows

    try:
        group = dist.group.WORLD
        if case == "other host" and rank == 1:
            shared_rows._host_id = lambda: 12345  # this rank claims another host
        if case == "no space" and rank == world - 1:

            def full(fd, offset, length):
                raise OSError(28, "No space left on device")

            os.posix_fallocate = full
        expect_regions = case == "grow"
        grown, capacity = 0, [0] * world
        for i, rows_per_rank in enumerate((4, 300, 40, 3000, 0)):  # grows, shrinks, grows, nothing to send
            padded = i % 2 == 1
            x, meta, index, table = _round(rank, world, rows_per_rank, seed=i + 1, padded=padded)
            everyone = [None] * world
            dist.all_gather_object(everyone, (x, meta, index))
            want = _expected(rank, world, everyone, table)
            for shared in (True, False):
                got = _exchange(group, x, meta, index, table, padded, shared)
                assert torch.equal(got[0].view(torch.int16), want[0].view(torch.int16)), (case, i, shared)
                assert torch.equal(got[1], want[1]), (case, i, shared)
            regions = shared_rows.regions(OP, group, 30.0)
            assert (regions is not None) == expect_regions, (case, regions)
            if regions is not None:
                need = [int(n) * (WIDTH * 2 + 5) for n in table.sum(1)]
                assert all(c >= n for c, n in zip(regions.capacity, need)), (regions.capacity, need)
                grown += any(n > c for n, c in zip(need, capacity))
                capacity = list(regions.capacity)
                dist.barrier()  # every rank has mapped (and the owners unlinked) before the directory is read
                assert not _our_files(regions.token), _our_files(regions.token)
        if expect_regions:
            assert regions.generation == grown >= 2, (regions.generation, grown)  # one step per growth
        assert not [f for f in os.listdir("/dev/shm") if f.startswith("torch_ascend_moe_ep_")]
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    dist.barrier()
    dist.destroy_process_group()


def _failed_barrier(regions, group, timeout_s: float) -> tuple[str, float]:
    """The error of a barrier that must fail, and how long it took."""
    import time

    start = time.monotonic()
    try:
        regions.barrier(OP, group, timeout_s, "the test's barrier")
    except RuntimeError as e:
        return str(e), time.monotonic() - start
    raise AssertionError("a barrier a rank missed passed")


def control_checks(rank: int, world: int, store_path: str) -> None:
    """The control blocks' small collectives (``shared_rows._Regions.all_gather``, ``transport.all_reduce_max``)
    give what gloo's give over many rounds (both header slots, rows of every length); then rank 1 stops taking
    part: rank 0's barrier times out naming the rank, and once rank 1 has exited, says so at once."""
    import time

    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    from torch_ascend_moe.distributed import shared_rows, transport

    try:
        group = dist.group.WORLD
        regions = shared_rows.regions(OP, group, 30.0)
        assert regions is not None and len(regions.control) == world
        g = torch.Generator().manual_seed(7 + rank)
        for i in range(40):
            n = 1 + i % shared_rows.slot_words(world)
            row = torch.randint(-(2**62), 2**62, (n,), dtype=torch.int64, generator=g)
            want = [torch.empty_like(row) for _ in range(world)]
            dist.all_gather(want, row)
            got = regions.all_gather(OP, group, row, 30.0, "the test's all-gather")
            assert torch.equal(got, torch.stack(want)), (i, got, want)
            t = row[:3].clone()
            ref = t.clone()
            dist.all_reduce(ref, op=dist.ReduceOp.MAX)
            transport.all_reduce_max(OP, group, t, 30.0)
            assert torch.equal(t, ref), (i, t, ref)
        assert regions.barriers == 80, regions.barriers
        dist.barrier()
        # Out of step (a rank that raised between two steps of an op meets its peers' next barrier with another
        # step): both ranks raise at once naming the other's step, and the counts stay in step for what follows.
        steps = ("the test's header", "the test's rows")
        for step in steps:  # every rank takes both steps once: the error names them
            regions.barrier(OP, group, 30.0, step)
        mine, other = steps if rank == 1 else steps[::-1]
        start = time.monotonic()
        try:
            regions.barrier(OP, group, 30.0, mine)
            raise AssertionError("a barrier met at different steps passed")
        except RuntimeError as e:
            want = f"{OP}: rank {rank} of {world}: {mine}: rank {1 - rank} arrived at {other}: the ranks are out"
            assert str(e).startswith(want), str(e)
        assert time.monotonic() - start < 5
        regions.barrier(OP, group, 30.0, "the test's barrier")
        assert regions.barriers == 84, regions.barriers
        dist.barrier()
        if rank == 1:
            time.sleep(2.5)  # misses rank 0's 1 s barrier, then exits without a word
            os._exit(0)
        msg, elapsed = _failed_barrier(regions, group, 1.0)
        assert 1.0 <= elapsed < 5, elapsed
        want = f"{OP}: rank 0 of {world}: the test's barrier did not complete within 1 s (a rank never arrived"
        assert msg.startswith(want) and msg.endswith("rank 1 has not arrived"), msg
        time.sleep(3)  # rank 1 has exited now
        msg, elapsed = _failed_barrier(regions, group, 100.0)
        assert elapsed < 5, elapsed
        assert "before its 100 s timeout (a peer rank exited or crashed" in msg, msg
        assert msg.endswith(f"rank 1's process {regions.pids[1]} has exited"), msg
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)  # the group is out of step now: no final barrier
