"""Device-generic ``moe_topk_gate``: TileKernels' gate (its ``tile_kernels.torch.top2_sum_gate`` semantics, and the
Ascend era's ``moe_topk_gate_forward`` with ``clamp_denominator=False``) on every row at once, inactive rows masked
at the end, so nothing depends on a host read of the masks (capturable; only the value checks read the host)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks import moe_gate as gate_checks
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.routing_math import gate_scores, stable_topk, tp_masked


def group_limited(ranking: torch.Tensor, num_groups: int, num_topk_groups: int) -> torch.Tensor:
    """``ranking`` with -inf outside each row's best ``num_topk_groups`` groups (a group's score: its top-2 sum)."""
    T, E = ranking.shape
    grouped = ranking.view(T, num_groups, E // num_groups)
    group_scores = grouped.topk(gate_checks.GROUP_SUM_TOPK, dim=-1, sorted=False).values.sum(-1)
    kept = torch.zeros(T, num_groups, dtype=torch.bool, device=ranking.device)
    kept.scatter_(1, stable_topk(group_scores, num_topk_groups), True)
    return grouped.masked_fill(~kept[:, :, None], float("-inf")).view(T, E)


@portable_kernel
def moe_topk_gate(args):
    sh = gate_checks.moe_topk_gate_signature(args)
    logits = args.logits
    T, E, dev = sh.T, sh.E, logits.device
    active = torch.ones(T, dtype=torch.bool, device=dev) if args.mask is None else args.mask
    if capture.host_readable(logits):
        gate_checks.check_values(args, active)
    u = gate_scores(logits, args.scoring_func)
    bias = torch.zeros(E, dtype=logits.dtype, device=dev) if args.bias is None else args.bias
    bias = bias.expand(T, E)
    if args.image_bias is not None:
        bias = torch.where(args.image_token_mask[:, None], args.image_bias, bias)
    ranking = (logits if args.scoring_func == "softmax" else u) + bias
    if args.num_groups != args.num_topk_groups:
        ranking = group_limited(ranking, args.num_groups, args.num_topk_groups)
    idx = stable_topk(ranking, args.num_topk)
    if args.fix_routing_mask is not None:
        idx = torch.where(args.fix_routing_mask[:, None], args.unmapped_topk_idx, idx)
    unmapped = torch.where(active[:, None], idx, -1)
    # A fixed -1 slot reads expert 0's score into the sum, as TileKernels' reference does.
    s = u.gather(1, idx.clamp(min=0))
    total = s.sum(-1, keepdim=True)
    denominator = total.clamp(min=1e-20) if args.clamp_denominator else total + 1e-20
    weights = s / denominator * args.routed_scaling_factor
    shared = args.num_shared_experts
    if shared:
        idx = torch.cat([idx, torch.arange(E, E + shared, device=dev).expand(T, shared)], dim=1)
        weights = torch.cat([weights, weights.new_ones(T, shared)], dim=1)
    if args.to_physical_map is not None:
        valid = idx >= 0
        logical = idx.clamp(min=0)
        token = torch.arange(T, device=dev)[:, None]
        duplicate = (args.ep_rank + token * gate_checks.DUPLICATE_HASH) % args.logical_count.long()[logical]
        idx = torch.where(valid, args.to_physical_map.long()[logical, duplicate], idx)
    idx = tp_masked(idx, (E + sh.extra) // args.num_ep_ranks, args.tp_rank, args.num_tp_ranks)
    return (
        torch.where(active[:, None], weights, 0),
        torch.where(active[:, None], idx, -1),
        unmapped,
        torch.where(active[:, None], u, 0),
    )
