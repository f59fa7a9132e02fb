"""Rows between the ranks of one host through shared memory: the CPU counterpart of DeepEP's intranode NVLink
buffers. Each rank owns one region (a ``/dev/shm`` file every rank of the group maps); an exchange writes this
rank's rows for every peer into its own region, syncs once, and copies the rows meant for it out of each
peer's region: one copy on each side instead of gloo's socket round trip through the kernel.

Protocol (every rank runs the same steps, decided from values every rank holds):
- A group uses regions when all its ranks share one host (hostname and boot id) and ``/dev/shm``, and none set
  ``TORCH_ASCEND_MOE_EP_SHM=0``; decided once per group by one ``all_gather``.
- Callers exchange their header before the rows (``exchange.exchange_header``), so every rank knows every
  rank's send counts: every rank computes the size each region needs, and grows them identically. A region
  grows (to a power of two) in one step: its owner creates and maps a new file, a sync, every peer maps it, a
  sync, the owner unlinks it (the mappings stay; no file outlives the step, so a crash leaks nothing later).
  A rank that cannot create or map a file (``/dev/shm`` full) makes every rank fall back to the socket
  transport for the rest of the group's life.
- A region is written only after the header of the op writing it, and every rank reads its peers' regions
  before it enters its next header: the header exchange is what keeps a writer off rows a peer still reads.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets
import socket
import weakref

import torch
import torch.distributed as dist

ENV = "TORCH_ASCEND_MOE_EP_SHM"
DIRECTORY = "/dev/shm"
_MIN_BYTES = 1 << 20
# By group, weakly: a destroyed group's regions go with it (holding a group past its destruction aborts at exit).
_state: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def regions(op: str, group, timeout_s: float) -> _Regions | None:
    """The group's regions, or None where they cannot be used (decided on first use, the same on every rank; a
    collective, so every rank must call it at the same point)."""
    if group.size() == 1:
        return None
    if group not in _state:
        _state[group] = _detect(op, group, timeout_s)
    found = _state[group]
    return None if found is None or found.broken else found


def _host_id() -> int:
    boot = ""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        pass
    digest = hashlib.blake2b(f"{socket.gethostname()}|{boot}".encode(), digest_size=7).digest()
    return int.from_bytes(digest, "little")


def _detect(op: str, group, timeout_s: float) -> _Regions | None:
    from torch_ascend_moe.distributed.exchange import wait

    usable = os.environ.get(ENV, "1") != "0" and os.path.isdir(DIRECTORY) and os.access(DIRECTORY, os.W_OK)
    row = torch.tensor([_host_id(), int(usable), secrets.randbits(62), os.getpid()], dtype=torch.int64)
    gathered = [torch.empty_like(row) for _ in range(group.size())]
    wait(op, group, dist.all_gather(gathered, row, group=group, async_op=True), timeout_s, "the host check")
    table = torch.stack(gathered)
    if len(set(table[:, 0].tolist())) > 1 or not bool(table[:, 1].all()):
        return None
    # Rank 0's process id and random bits name the files of this group on this host.
    return _Regions(group.size(), f"{int(table[0, 3])}_{int(table[0, 2]):x}")


class _Regions:
    def __init__(self, ranks: int, token: str):
        self.token = token
        self.capacity = [0] * ranks  # bytes of every rank's region: the same list on every rank
        self.maps: list[torch.Tensor | None] = [None] * ranks
        self.generation = 0
        self.broken = False

    def _path(self, rank: int) -> str:
        return os.path.join(DIRECTORY, f"torch_ascend_moe_ep_{self.token}_{rank}_{self.generation}")

    def _sync(self, op: str, group, failed: bool, timeout_s: float, what: str) -> bool:
        """A barrier that also tells whether any rank failed."""
        from torch_ascend_moe.distributed.exchange import all_reduce_max

        flag = torch.tensor([int(failed)], dtype=torch.int64)
        all_reduce_max(op, group, flag, timeout_s, what)
        return bool(flag)

    def _grow(self, op: str, group, need: list[int], timeout_s: float) -> bool:
        rank = group.rank()
        grown = [max(_MIN_BYTES, 1 << (n - 1).bit_length()) if n > c else c for n, c in zip(need, self.capacity)]
        self.generation += 1
        maps, failed, path = list(self.maps), False, None
        if grown[rank] != self.capacity[rank]:
            path = self._path(rank)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.posix_fallocate(fd, 0, grown[rank])  # reserve the pages now: a full tmpfs is ENOSPC, not SIGBUS
                finally:
                    os.close(fd)
                maps[rank] = torch.from_file(path, shared=True, size=grown[rank], dtype=torch.uint8)
            except (OSError, RuntimeError):
                failed = True
        if not self._sync(op, group, failed, timeout_s, "the shared-memory setup"):
            for s, (g, c) in enumerate(zip(grown, self.capacity)):
                if s != rank and g != c:
                    try:
                        maps[s] = torch.from_file(self._path(s), shared=True, size=g, dtype=torch.uint8)
                    except (OSError, RuntimeError):
                        failed = True
            failed = self._sync(op, group, failed, timeout_s, "the shared-memory setup")
        else:
            failed = True
        if path is not None:
            try:
                os.unlink(path)
            except OSError:
                pass
        if failed:  # every rank saw the same flags: all of them fall back together
            self.broken = True
            self.maps = [None] * group.size()
            return False
        self.capacity, self.maps = grown, maps
        return True

    def exchange(self, op, group, pairs, send_rows: torch.Tensor, index, padded, timeout_s, views: bool = False):
        """Rows of every ``(out, rows)`` pair to the ranks ``send_rows[s, d]`` (an [R, R] table every rank holds)
        says; this rank's own rows are gathered straight into ``out``. With ``views`` (no ``index``; ``out`` may be
        None) nothing is copied on the receiving side: per pair, the rows from each source in source order, as
        uint8 ``[rows, bytes]`` views (this rank's own of ``rows``, the peers' of their regions: valid until this
        rank's next header exchange on the group). None (nothing moved) where the regions cannot be set up: the
        caller then uses the socket transport."""
        from torch_ascend_moe.distributed.exchange import as_bytes, gather_rows, offsets, row_bytes

        r, rank = group.size(), group.rank()
        widths = [row_bytes(rows) for _, rows in pairs]
        table = send_rows.tolist()
        starts = [offsets(row, 0, r) for row in table]  # starts[s][d]: rank s's first row for rank d
        # bases[s][j]: where pair j's rows start in rank s's region ([rows sent, width] blocks, 16-byte aligned so
        # a block viewed as its dtype is aligned); the last entry is the size the region needs.
        bases = [list(itertools.accumulate(((at[-1] * w + 15) // 16 * 16 for w in widths), initial=0)) for at in starts]
        need = [b[-1] for b in bases]
        if any(n > c for n, c in zip(need, self.capacity)) and not self._grow(op, group, need, timeout_s):
            return None

        def block(s: int, j: int, d: int) -> torch.Tensor:
            """Pair j's rows from rank s for rank d, in rank s's region."""
            begin, end, base = starts[s][d], starts[s][d + 1], bases[s][j]
            return self.maps[s][base + begin * widths[j] : base + end * widths[j]].view(end - begin, widths[j])

        mine, at = starts[rank], sum(table[s][rank] for s in range(rank))  # at: where own rows land in out
        for j, (out, rows) in enumerate(pairs):
            for d in range(r):
                if d != rank and mine[d + 1] > mine[d]:
                    gather_rows(rows, index, mine[d], mine[d + 1], padded, block(rank, j, d))
            if not views and table[rank][rank]:  # this rank's own rows, straight into out
                own = as_bytes(out)[at : at + table[rank][rank]]
                gather_rows(rows, index, mine[rank], mine[rank + 1], padded, own)
        self._sync(op, group, False, timeout_s, "the all-to-all")
        if views:
            return [
                [as_bytes(rows)[mine[rank] : mine[rank + 1]] if s == rank else block(s, j, rank) for s in range(r)]
                for j, (_, rows) in enumerate(pairs)
            ]
        for j, (out, _) in enumerate(pairs):
            dst, at = as_bytes(out), 0
            for s in range(r):
                n = table[s][rank]
                if n and s != rank:
                    dst[at : at + n].copy_(block(s, j, rank))
                at += n
        return []
