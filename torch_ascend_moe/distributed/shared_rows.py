"""Rows between the ranks of one host through shared memory: the CPU counterpart of DeepEP's intranode NVLink
buffers. Each rank owns one region (a ``/dev/shm`` file every rank of the group maps); an exchange writes this
rank's rows for every peer into its own region, syncs once, and copies the rows meant for it out of each
peer's region: one copy on each side instead of gloo's socket round trip through the kernel.

Protocol (every rank runs the same steps, decided from values every rank holds):
- A group uses regions when all its ranks share one host (hostname and boot id) and ``/dev/shm``, and none set
  ``TORCH_ASCEND_MOE_EP_SHM=0``; decided once per group by one ``all_gather``, at the group's first header.
- Each rank also owns a small control block (mapped by every rank for the group's life): a barrier count and
  two header slots. A barrier is a count every rank publishes (release store) and waits for in its peers'
  blocks (acquire loads, ``_C._shm_wait``): no socket round trip. Headers (``agreement.gather_header``) and
  small all-reduces go through the slots: a rank writes its row into slot ``count % 2`` of its own block, then
  passes the barrier, then reads every rank's slot. A rank reaches barrier ``n + 2`` (which rewrites slot
  ``n % 2``) only after every peer reached ``n + 1``, i.e. after every peer read the slots of barrier ``n``.
  A wait is bounded by the op's timeout and notices a peer process that has exited (its ``/proc`` entry).
- A barrier also carries its step (a code of ``what``: the header exchange, the all-to-all, ...), written beside
  the count before the count is published. A count alone would let a rank that raised between two steps of an
  op (after the header, before the rows' barrier) meet its peers' rows barrier with its next op's header: the
  peers would read rows never written. Every rank compares its peers' step with its own and raises at once when
  they differ; the counts stay in step, so the group goes on with the next op. (Headers pair whatever the op,
  so that different ops on different ranks get the header's own error.)
- Callers exchange their header before the rows (``agreement.exchange_header``), so every rank knows every
  rank's send counts: every rank computes the size each region needs, and grows them identically. A region
  grows (to a power of two) in one step: its owner creates and maps a new file, a sync, every peer maps it, a
  sync, the owner unlinks it (the mappings stay; no file outlives the step, so a crash leaks nothing later).
  A rank that cannot create or map a file (``/dev/shm`` full) makes every rank fall back to the socket
  transport (and gloo's collectives for headers) for the rest of the group's life.
- A region is written only after the header of the op writing it, then a barrier, then every rank reads the
  rows meant for it; every rank reads its peers' regions before it enters its next header: the header's
  barrier is what keeps a writer off rows a peer still reads.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import secrets
import socket
import time
import weakref
import zlib

import torch
import torch.distributed as dist

from torch_ascend_moe.distributed.payload import as_bytes, gather_rows, offsets, row_bytes
from torch_ascend_moe.distributed.waits import failed_error, out_of_step_error, timeout_error, wait

ENV = "TORCH_ASCEND_MOE_EP_SHM"
DIRECTORY = "/dev/shm"
_MIN_BYTES = 1 << 20
_FLAG_WORDS = 8  # the barrier count and its steps on one 64-byte line; the header slots follow
# Words 4..7 of the line: the step of each of this rank's last 4 barriers, by count. While a rank waits at barrier n
# a healthy peer is at n or n + 1 (it passes n + 1 only after this rank reaches it), so the peer's step of n is
# still there when this rank reads it.
_STEP_AT, _STEPS = 4, 4
_step_names: dict[int, str] = {}  # the steps this process has taken, for the error naming a peer's
_WAIT_SLICE_S = 0.05  # how often a waiting rank looks at the clock and its peers' processes
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
    usable = os.environ.get(ENV, "1") != "0" and os.path.isdir(DIRECTORY) and os.access(DIRECTORY, os.W_OK)
    row = torch.tensor([_host_id(), int(usable), secrets.randbits(62), os.getpid()], dtype=torch.int64)
    gathered = [torch.empty_like(row) for _ in range(group.size())]
    wait(op, group, dist.all_gather(gathered, row, group=group, async_op=True), timeout_s, "the host check")
    table = torch.stack(gathered)
    if len(set(table[:, 0].tolist())) > 1 or not bool(table[:, 1].all()):
        return None
    # Rank 0's process id and random bits name the files of this group on this host.
    found = _Regions(group.size(), f"{int(table[0, 3])}_{int(table[0, 2]):x}", table[:, 3].tolist())
    return found if found.set_up_control(op, group, timeout_s) else None


def slot_words(ranks: int) -> int:
    """Words of a header slot: the header's length (``agreement.gather_header``): op code, fields and flags < 32,
    two counts per rank."""
    return 32 + 2 * ranks


def _stat_state(pid: int) -> str | None:
    """The process's state letter from ``/proc``; None when it cannot be read (no such process, or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _step_code(what: str) -> int:
    code = zlib.crc32(what.encode())
    _step_names.setdefault(code, what)
    return code


def _gone(pid: int) -> bool:
    return _stat_state(pid) in (None, "Z", "X")  # exited; a zombie has exited but is not yet reaped


class _Regions:
    def __init__(self, ranks: int, token: str, pids: list[int]):
        self.token = token
        self.capacity = [0] * ranks  # bytes of every rank's region: the same list on every rank
        self.maps: list[torch.Tensor | None] = [None] * ranks
        self.generation = 0
        self.broken = False
        self.pids = pids
        self.control: list[torch.Tensor] = []  # every rank's control block, int64 words
        self.barriers = 0  # barriers passed: the same count on every rank
        self.watched: list[bool] = []  # peers whose process this rank can see (their exit is noticed)

    def _path(self, rank: int, kind: str = "rows") -> str:
        return os.path.join(DIRECTORY, f"torch_ascend_moe_ep_{self.token}_{kind}_{rank}_{self.generation}")

    def _sync(self, op: str, group, failed: bool, timeout_s: float, what: str) -> bool:
        """A barrier that also tells whether any rank failed (on gloo: the control blocks may not exist yet)."""
        flag = torch.tensor([int(failed)], dtype=torch.int64)
        wait(op, group, dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group, async_op=True), timeout_s, what)
        return bool(flag)

    def _share(self, op: str, group, sizes: list[int | None], kind: str, timeout_s: float):
        """Every rank ``s`` with ``sizes[s]`` creates a file of that size; every rank maps all of them (None where
        no file); None on every rank if any rank failed."""
        rank = group.rank()
        maps: list[torch.Tensor | None] = [None] * group.size()
        failed, path = False, None
        if sizes[rank] is not None:
            path = self._path(rank, kind)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    os.posix_fallocate(fd, 0, sizes[rank])  # reserve the pages now: a full tmpfs is ENOSPC, not SIGBUS
                finally:
                    os.close(fd)
                maps[rank] = torch.from_file(path, shared=True, size=sizes[rank], dtype=torch.uint8)
            except (OSError, RuntimeError):
                failed = True
        if not self._sync(op, group, failed, timeout_s, "the shared-memory setup"):
            for s, size in enumerate(sizes):
                if s != rank and size is not None:
                    try:
                        maps[s] = torch.from_file(self._path(s, kind), shared=True, size=size, dtype=torch.uint8)
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
        return None if failed else maps  # every rank saw the same flags: all of them fall back together

    def set_up_control(self, op: str, group, timeout_s: float) -> bool:
        """Create and map every rank's control block (at the group's first header, on every rank)."""
        words = _FLAG_WORDS + 2 * slot_words(group.size())
        maps = self._share(op, group, [words * 8] * group.size(), "control", timeout_s)
        if maps is None:
            return False
        self.control = [m.view(torch.int64) for m in maps]
        rank = group.rank()
        # A peer whose /proc entry this rank cannot see (another pid namespace) is never called gone: its
        # silence is a timeout.
        self.watched = [s != rank and _stat_state(pid) is not None for s, pid in enumerate(self.pids)]
        return True

    def barrier(self, op: str, group, timeout_s: float, what: str) -> None:
        """Every rank of the group arrives: what any rank wrote to shared memory before is visible to all."""
        from torch_ascend_moe import _C

        self.barriers += 1
        rank, target = group.rank(), self.barriers
        step = _step_code(what)
        self.control[rank][_STEP_AT + target % _STEPS] = step  # before the count: the release store publishes both
        _C._shm_publish(self.control[rank].data_ptr(), target)
        peers = [s for s in range(group.size()) if s != rank]
        addresses = [self.control[s].data_ptr() for s in peers]
        start = time.monotonic()
        while True:
            elapsed = time.monotonic() - start
            late = _C._shm_wait(addresses, target, min(_WAIT_SLICE_S, max(timeout_s - elapsed, 0.0)))
            if late < 0:
                self._check_steps(op, group, what, target, step, peers)
                return
            peer, elapsed = peers[late], time.monotonic() - start
            if self.watched[peer] and _gone(self.pids[peer]):
                detail = f"rank {peer}'s process {self.pids[peer]} has exited"
                raise failed_error(op, group, what, elapsed, timeout_s, detail)
            if elapsed >= timeout_s:
                raise timeout_error(op, group, what, timeout_s, f"rank {peer} has not arrived")

    def _check_steps(self, op: str, group, what: str, target: int, step: int, peers: list[int]) -> None:
        """Raise when a peer reached barrier ``target`` at another step than this rank (see the module's doc)."""
        for peer in peers:
            count = int(self.control[peer][0])
            theirs = int(self.control[peer][_STEP_AT + target % _STEPS])
            if count - target >= _STEPS:
                raise out_of_step_error(op, group, what, peer, f"{count - target} barriers ahead")
            if theirs != step:
                name = _step_names.get(theirs, f"a step this rank has not taken (code {theirs})")
                raise out_of_step_error(op, group, what, peer, f"at {name}")

    def all_gather(self, op: str, group, row: torch.Tensor, timeout_s: float, what: str) -> torch.Tensor:
        """Every rank's int64 ``row`` (at most ``slot_words`` long) as an ``[R, len(row)]`` table."""
        n = row.numel()
        base = _FLAG_WORDS + ((self.barriers + 1) % 2) * slot_words(group.size())
        self.control[group.rank()][base : base + n].copy_(row)
        self.barrier(op, group, timeout_s, what)
        return torch.stack([c[base : base + n] for c in self.control])  # a copy: the slots are rewritten later

    def _grow(self, op: str, group, need: list[int], timeout_s: float) -> bool:
        grown = [max(_MIN_BYTES, 1 << (n - 1).bit_length()) if n > c else c for n, c in zip(need, self.capacity)]
        self.generation += 1
        new = self._share(op, group, [g if g != c else None for g, c in zip(grown, self.capacity)], "rows", timeout_s)
        if new is None:
            self.broken = True
            self.maps = [None] * group.size()
            return False
        self.capacity, self.maps = grown, [m if n is None else n for m, n in zip(self.maps, new)]
        return True

    def exchange(self, op, group, pairs, send_rows: torch.Tensor, index, padded, timeout_s, views: bool = False):
        """Rows of every ``(out, rows)`` pair to the ranks ``send_rows[s, d]`` (an [R, R] table every rank holds)
        says; this rank's own rows are gathered straight into ``out``. With ``views`` (no ``index``; ``out`` may be
        None) nothing is copied on the receiving side: per pair, the rows from each source in source order, as
        uint8 ``[rows, bytes]`` views (this rank's own of ``rows``, the peers' of their regions: valid until this
        rank's next header exchange on the group). None (nothing moved) where the regions cannot be set up: the
        caller then uses the socket transport."""
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
        self.barrier(op, group, timeout_s, "the all-to-all")
        if views:
            # A peer that sends this rank nothing may never have shared a region (maps[s] None): its block is empty.
            return [
                [
                    as_bytes(rows)[mine[rank] : mine[rank + 1]]
                    if s == rank
                    else (block(s, j, rank) if table[s][rank] else as_bytes(rows)[:0])
                    for s in range(r)
                ]
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
