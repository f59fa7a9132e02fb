"""DeepEP V1's shrink mode (``Buffer(..., enable_shrink=True)``; specs/upstream_2609.md §9.3) for the low-latency
calls of ``deep_ep.Buffer``.

Upstream keeps an int32 mask per rank (1 = masked). A low-latency barrier, dispatch or combine that waits on a peer
longer than the timeout masks that peer instead of trapping; masked ranks are skipped from then on: nothing is sent
to them or awaited from them, a masked source counts as 0 received tokens, and the combine skips top-k entries whose
expert lives on a masked rank (they contribute 0; the remaining weights are not renormalised).

Ours: every low-latency call of a shrink-mode buffer first runs a liveness round on the default store: each rank
posts one key per call and waits for each unmasked peer's key until the buffer's ``num_cpu_timeout_secs``; a peer
that does not post in time is masked (with a warning, as upstream prints). The call then runs our ep ops on the
process group of the ranks still alive (``new_group(..., use_local_synchronization=True)``, one per alive set), with
expert ids renumbered for it (experts of masked ranks become -1: skipped), and its results are laid out as upstream's
``[L, R * T_max, ...]`` for all ``R`` ranks (masked sources empty). Like upstream, survivors that time out at
different moments can disagree on the mask: the next call then fails on its own timeout rather than hang.
"""

from __future__ import annotations

import time
import warnings

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from torch_ascend_moe import checks as ck
from torch_ascend_moe.backends.portable.ep.low_latency import ll_row_sources

_POLL_S = 0.005


class ShrinkState:
    """A shrink-mode buffer's mask, its liveness rounds and the process groups of its alive sets."""

    def __init__(self, group, api: str):
        self.group = group
        self.api = api
        self.rank, self.size = group.rank(), group.size()
        self.mask = torch.zeros(self.size, dtype=torch.int32)
        self._calls = 0
        self._groups: dict[tuple, object] = {}

    # ---- upstream's mask API ----

    def update(self, rank_to_mask: int, mask: bool) -> None:
        if not 0 <= rank_to_mask < self.size:
            api = f"{self.api}.low_latency_update_mask_buffer"
            raise ValueError(ck.message(api, "rank_to_mask", "value", f"a rank in [0, {self.size})", str(rank_to_mask)))
        self.mask[rank_to_mask] = int(bool(mask))

    def query(self, mask_status: torch.Tensor) -> None:
        ok = mask_status.dtype == torch.int32 and mask_status.shape == (self.size,)
        if not ok:
            api = f"{self.api}.low_latency_query_mask_buffer"
            got = f"{mask_status.dtype} {list(mask_status.shape)}"
            raise ValueError(ck.message(api, "mask_status", "value", f"int32 [{self.size}]", got))
        mask_status.copy_(self.mask)

    def clean(self) -> None:
        self.mask.zero_()

    # ---- the liveness round and the alive group ----

    def alive(self, timeout_s: float) -> list[int]:
        """Post this call's key, wait for each unmasked peer's until the deadline, mask the late ones; the ranks
        alive after it (this one included, in rank order)."""
        store = distributed_c10d._get_default_store()
        self._calls += 1
        prefix = f"deep_ep_shrink/{self.group.group_name}/{self._calls}/"
        store.set(prefix + str(self.rank), "1")
        deadline = time.monotonic() + timeout_s
        waiting = [p for p in range(self.size) if p != self.rank and not self.mask[p]]
        while waiting:
            waiting = [p for p in waiting if not store.check([prefix + str(p)])]
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        for p in waiting:
            warnings.warn(
                f"{self.api}: rank {p} did not reach the low-latency call in {timeout_s} s: masked (shrink mode)",
                RuntimeWarning,
                stacklevel=3,
            )
            self.mask[p] = 1
        return [p for p in range(self.size) if p == self.rank or not self.mask[p]]

    def process_group(self, alive: list[int]):
        """The process group of the alive ranks (the buffer's own when none is masked)."""
        if len(alive) == self.size:
            return self.group
        key = tuple(alive)
        if key not in self._groups:
            ranks = [dist.get_global_rank(self.group, r) for r in alive]
            self._groups[key] = dist.new_group(ranks, use_local_synchronization=True)
        return self._groups[key]


def renumber(topk_idx: torch.Tensor, alive: list[int], size: int, local: int) -> torch.Tensor:
    """Expert ids for the alive ranks' group: rank ``alive[p]``'s local expert ``j`` becomes ``p * local + j``; the
    experts of masked ranks become -1 (skipped, as upstream's kernels skip them)."""
    position = torch.full((size,), -1, dtype=torch.long, device=topk_idx.device)
    position[alive] = torch.arange(len(alive), device=topk_idx.device)
    idx = topk_idx.long()
    p = position[torch.where(idx >= 0, idx // local, 0).clamp(max=size - 1)]
    return torch.where((idx >= 0) & (p >= 0), p * local + idx % local, -1).to(topk_idx.dtype)


def widen(size: int, t_max: int, recv: torch.Tensor, fill) -> torch.Tensor:
    """``[L, |alive| * T_max, ...]`` rows (valid ones first, as our transport packs them) inside upstream's
    ``[L, size * T_max, ...]``."""
    out = recv.new_full((recv.shape[0], size * t_max, *recv.shape[2:]), fill)
    out[:, : recv.shape[1]] = recv
    return out


def widen_layout(alive: list[int], size: int, layout_range: torch.Tensor) -> torch.Tensor:
    """``[L, |alive|]`` (begin << 32 | count) per alive source -> upstream's ``[L, size]``, masked sources empty."""
    out = layout_range.new_zeros(layout_range.shape[0], size)
    out[:, alive] = layout_range
    return out


def narrow_rows(x: torch.Tensor, src_info: torch.Tensor, layout_range: torch.Tensor, alive: list[int], t_max: int):
    """For a combine over ``alive``: the rows of ``x [L, R * T_max, H]`` from alive sources packed first, with their
    ``src_info`` and ``layout_range [L, |alive|]`` (each source's segment moved, its order kept)."""
    local, n = src_info.shape
    source, inside = ll_row_sources(layout_range, n)
    keep_source = torch.zeros(layout_range.shape[1], dtype=torch.bool, device=x.device)
    keep_source[alive] = True
    keep = inside & keep_source[source]
    cols = len(alive) * t_max
    position = torch.where(keep, keep.long().cumsum(1) - 1, cols)  # dropped rows land in a spare last column
    x_out = x.new_zeros(local, cols + 1, *x.shape[2:])
    x_out.scatter_(1, position.view(local, n, *([1] * (x.dim() - 2))).expand_as(x), x)
    info = src_info.new_full((local, cols + 1), -1)
    info.scatter_(1, position, torch.where(keep, src_info, -1))
    begins, counts = layout_range >> 32, layout_range & 0xFFFFFFFF
    kept_counts = torch.where(keep_source, counts, 0)
    # A source's new begin: the kept rows of the sources whose segments start before its own.
    before = (begins.unsqueeze(2) > begins.unsqueeze(1)) & keep_source.view(1, 1, -1)
    new_begins = (before * kept_counts.unsqueeze(1)).sum(-1)
    layout = ((new_begins << 32) | kept_counts)[:, alive]
    return x_out[:, :cols], info[:, :cols], layout
