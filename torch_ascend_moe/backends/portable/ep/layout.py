"""Stage 1, layout: where each token goes (DeepEP's ``get_dispatch_layout``): tokens per rank, per node, per
expert, and the token-by-rank mask; plus the per-local-expert slot counts a receiving rank reports. Tensor ops
without host syncs (capturable)."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks import ep as ep_checks
from torch_ascend_moe.distributed import capture


@portable_kernel("ep_dispatch_layout")
def layout(topk_idx, num_experts, num_ranks, ranks_per_node):
    """DeepEP's get_dispatch_layout (specs §3)."""
    ep_checks.layout_signature(topk_idx, num_experts, num_ranks, ranks_per_node)
    if not capture.capturing(topk_idx.device):
        bad = (topk_idx < -1) | (topk_idx >= num_experts)
        if bool(bad.any()):
            expected = f"expert ids in [-1, {num_experts})"
            raise ValueError(ck.message(ep_checks.LAYOUT, "topk_idx", "values", expected, int(topk_idx[bad][0])))
    return layout_of(topk_idx.long(), num_experts, num_ranks, ranks_per_node)


def layout_of(idx, num_experts, num_ranks, ranks_per_node=8):
    """layout of valid ids, without host syncs (scatters with a spare slot, no boolean indexing): capturable.
    ``(num_tokens_per_rank, num_tokens_per_node, num_tokens_per_expert, is_token_in_rank)``, int32 counts."""
    t = idx.shape[0]
    valid = idx >= 0
    per_expert = torch.zeros(num_experts + 1, dtype=torch.int64, device=idx.device)
    # reshape, not view: topk_idx may come with any strides.
    per_expert.index_add_(0, torch.where(valid, idx, num_experts).reshape(-1), torch.ones_like(idx).reshape(-1))
    rank_of = torch.where(valid, idx // (num_experts // num_ranks), num_ranks)
    in_rank = torch.zeros(t, num_ranks + 1, dtype=torch.bool, device=idx.device).scatter_(1, rank_of, True)
    in_rank = in_rank[:, :num_ranks].clone(memory_format=torch.contiguous_format)
    nodes = max(1, num_ranks // ranks_per_node)
    if num_ranks % ranks_per_node == 0:
        in_node = in_rank.view(t, nodes, ranks_per_node).any(-1)
    else:  # fewer ranks than one node holds: a single node
        in_node = in_rank.any(1, keepdim=True)
    return (
        in_rank.sum(0).int(),
        in_node.sum(0).int(),
        per_expert[:num_experts].int(),
        in_rank,
    )


def per_local_expert(local_ids: torch.Tensor, mine: torch.Tensor, local_experts: int, alignment: int) -> torch.Tensor:
    """Slots per local expert (``mine``: the slot is this rank's), rounded up to ``alignment``: int32 [L], no
    host sync (a spare slot takes the others)."""
    per_expert = torch.zeros(local_experts + 1, dtype=torch.int64, device=local_ids.device)
    where = torch.where(mine, local_ids, local_experts).reshape(-1)
    per_expert.index_add_(0, where, torch.ones_like(where))
    return ((per_expert[:local_experts] + alignment - 1) // alignment * alignment).int()
