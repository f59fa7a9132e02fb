"""DeepEP V2's bookkeeping beyond the ops' outputs (``deep_ep.ElasticBuffer`` translates; this computes): the
dispatch handle's routing fields its epilogue writes, the worst-case expanded capacity of a dispatch without a
CPU sync, and the grouped slot reduction of its hybrid combine. Each has a CPU helper kernel or is plain tensor
ops without host syncs."""

from __future__ import annotations

import torch

from torch_ascend_moe.checks import ep as ep_checks
from torch_ascend_moe.distributed import capture


def expand_capacity(num_ranks: int, num_max: int, k: int, local: int, alignment: int) -> int:
    """Upstream's worst-case expanded rows without a CPU sync: every token of every rank on min(K, L) local
    experts, plus each expert's alignment padding."""
    rows = num_ranks * num_max * min(k, local) + (alignment - 1) * local
    return (rows + alignment - 1) // alignment * alignment


def handle_fields(recv_counts, recv_gather, recv_src_idx, recv_idx, topk_idx, num_max, su, local, padded):
    """The dispatch handle's routing fields: ``(psum_scaleup [su] int32, meta [N, K + 2] int32, unaligned [L]
    int32, dst_slots [T, K] int32)``. ``psum_scaleup``: cumulative real rows per source scale-up index (source
    ranks ``i::su``); ``meta`` per output row: (source rank * ``num_max`` + its token there, source rank * K + its
    first local lane, then -1s for the expanded rows), all -1 on padding rows; ``unaligned``: slots per local
    expert; ``dst_slots``: each of this rank's slots' row among those sent to its rank (``padded``: every token
    is sent, so its index), -1 for empty slots. One C++ pass on CPU."""
    if capture.host_kernels(recv_idx.device):
        return torch.ops.ascend_moe_kernels.elastic_handle_fields(
            recv_counts, recv_gather, recv_src_idx, recv_idx, topk_idx, num_max, su, local, padded
        )
    ep_checks.handle_fields_signature(recv_counts, recv_idx, topk_idx, su, local)
    return handle_fields_portable(
        recv_counts, recv_gather, recv_src_idx, recv_idx, topk_idx, num_max, su, local, padded
    )


def handle_fields_portable(recv_counts, recv_gather, recv_src_idx, recv_idx, topk_idx, num_max, su, local, padded):
    """handle_fields with tensor ops (CUDA / NPU, no host syncs): bitwise the CPU kernel's results."""
    r, device = recv_counts.shape[0], recv_idx.device
    n, k = recv_idx.shape
    # Each output row's source rank: received rows are source-major, so the source of buffer row j is the
    # first whose cumulative count exceeds j (padding rows, recv_gather -1, get -1).
    ends = torch.cumsum(recv_counts, 0)
    src_rank = torch.searchsorted(ends, recv_gather.clamp(min=0), right=True).clamp(max=r - 1)
    real = recv_gather >= 0
    src_rank = torch.where(real, src_rank, -1)
    per_source = torch.zeros(r + 1, dtype=torch.int64, device=device)
    per_source.index_add_(0, torch.where(real, src_rank, r), torch.ones_like(src_rank))
    groups = per_source[:r].view(-1, su).sum(0)  # source scale-up index i: ranks i::su
    lanes = recv_idx >= 0
    first_lane = torch.where(lanes.any(1), lanes.int().argmax(1), 0)
    meta = torch.full((n, k + 2), -1, dtype=torch.int32, device=device)
    meta[:, 0] = torch.where(real, src_rank * num_max + recv_src_idx, -1).int()
    meta[:, 1] = torch.where(real, src_rank * k + first_lane, -1).int()
    unaligned = torch.zeros(local + 1, dtype=torch.int64, device=device)
    unaligned.index_add_(0, torch.where(lanes, recv_idx, local).view(-1), torch.ones_like(recv_idx).view(-1))
    # dst_slots: a token's rank in its destination's send list.
    idx = topk_idx.long()
    t = idx.shape[0]
    owner = torch.where(idx >= 0, idx // local, r)
    in_rank = torch.zeros(t, r + 1, dtype=torch.int64, device=device).scatter_(1, owner, 1)[:, :r]
    pos = torch.arange(t, device=device).unsqueeze(1).expand(t, r) if padded else torch.cumsum(in_rank, 0) - 1
    pos = torch.cat([pos, pos.new_full((t, 1), -1)], 1)
    return torch.cumsum(groups, 0).int(), meta, unaligned[:local].int(), pos.gather(1, owner).int()


def grouped_reduce(y: torch.Tensor, group_id: torch.Tensor) -> torch.Tensor:
    """Per token, sum each group's slots (FP32, in slot order), round, and keep the sum at the group's last slot,
    zero at its other slots (upstream's grouped reduction; -1 slots form a group of zeros)."""
    t, k, h = y.shape
    out = torch.zeros_like(y)
    for j in range(k):
        same = group_id == group_id[:, j : j + 1]  # [T, K]: slot i is in slot j's group
        if j + 1 < k:
            last = ~same[:, j + 1 :].any(1)
        else:
            last = torch.ones(t, dtype=torch.bool, device=y.device)
        acc = torch.zeros(t, h, dtype=torch.float32, device=y.device)
        for i in range(j + 1):  # members before j in slot order; the others add +0
            acc = acc + torch.where(same[:, i : i + 1], y[:, i].float(), 0)
        out[:, j] = torch.where(last.unsqueeze(1), acc.to(y.dtype), 0)
    return out
