"""``tile_kernels.moe``: the gate and routing helpers with TileKernels' signatures and asserts."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.ops import moe_gate as ops
from torch_ascend_moe.tile_kernels.moe.ascend import (
    check_gate_buffers,
    moe_topk_gate,
    moe_topk_gate_backward,
    moe_topk_gate_forward,
)
from torch_ascend_moe.tile_kernels.moe.fused import (
    expand_to_fused,
    expand_to_fused_with_sf,
    get_fused_mapping,
    reduce_fused,
)
from torch_ascend_moe.tile_kernels.moe.scoring import ScoringFunc

__all__ = [
    "ScoringFunc",
    "aux_fi",
    "expand_to_fused",
    "expand_to_fused_with_sf",
    "get_fused_mapping",
    "group_count",
    "inplace_unique_group_indices",
    "mask_indices_by_tp",
    "moe_topk_gate",
    "moe_topk_gate_backward",
    "moe_topk_gate_forward",
    "normalize_weight",
    "reduce_fused",
    "top2_sum_gate",
    "topk_gate",
    "topk_sum_and_topk_group_idx",
]


def top2_sum_gate(
    logits: torch.Tensor,
    bias: torch.Tensor,
    num_topk: int,
    num_topk_groups: int,
    num_groups: int,
    use_shared_as_routed: bool,
    num_shared_experts: int,
    routed_scaling_factor: float,
    ep_rank: int,
    num_ep_ranks: int,
    tp_rank: int,
    num_tp_ranks: int,
    scoring_func: str,
    mask: torch.Tensor | None = None,
    fix_routing_mask: torch.Tensor | None = None,
    to_physical_map: torch.Tensor | None = None,
    logical_count: torch.Tensor | None = None,
    unmapped_topk_idx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3's fused gate: ``(topk_idx int64 [T, k + S'], topk_weights fp32 [T, k + S'])``; ``unmapped_topk_idx``
    (when given) receives the routed experts before mapping, as upstream's in/out argument. Within a row, slots come
    in the reference's order (routed by rank, then shared); upstream's kernel leaves that order unspecified."""
    assert logits.dim() == 2 and logits.is_contiguous() and logits.dtype == torch.float32
    assert bias.dim() == 1 and bias.is_contiguous() and bias.dtype == torch.float32
    assert logits.size(1) == bias.size(0)
    if mask is not None:
        assert mask.numel() == logits.size(0) and mask.dtype == torch.bool
    assert (to_physical_map is None) == (logical_count is None)
    E = logits.size(1)
    assert (num_groups == 0) == (num_topk_groups == 0), (
        "num_groups and num_topk_groups must be both zero or both non-zero."
    )
    assert num_topk <= E, f"num_topk ({num_topk}) must be less than or equal to num_routed_experts ({E})."
    assert num_topk_groups <= num_groups, (
        f"num_topk_groups ({num_topk_groups}) must be less than or equal to num_groups ({num_groups})."
    )
    if num_groups != 0:
        assert E % num_groups == 0, f"num_routed_experts ({E}) must be divisible by num_groups ({num_groups})."
    scoring = ScoringFunc.from_str(scoring_func)
    assert scoring != ScoringFunc.IDENTITY, "IDENTITY scoring function is not currently supported for top-2 sum moe."
    if not use_shared_as_routed:
        num_shared_experts = 0
    else:
        assert num_topk % num_shared_experts == 0
        assert E % (num_topk // num_shared_experts) == 0
    assert num_shared_experts in {1, 2} or (num_shared_experts == 0 and not use_shared_as_routed)
    check_gate_buffers(
        to_physical_map, logical_count, E + num_shared_experts, unmapped_topk_idx, logits.size(0), num_topk
    )
    assert num_shared_experts <= (0 if to_physical_map is None else to_physical_map.size(1) - 1)
    if fix_routing_mask is not None:
        assert unmapped_topk_idx is not None, "fix_routing_mask needs unmapped_topk_idx"
        assert fix_routing_mask.numel() == logits.size(0) and fix_routing_mask.dtype == torch.bool
    weights, idx, unmapped, _ = ops.moe_topk_gate(
        logits,
        bias,
        num_topk,
        num_groups=num_groups,
        num_topk_groups=num_topk_groups,
        scoring_func=str(scoring),
        routed_scaling_factor=routed_scaling_factor,
        num_shared_experts=num_shared_experts,
        mask=mask,
        fix_routing_mask=fix_routing_mask,
        unmapped_topk_idx=unmapped_topk_idx,
        to_physical_map=to_physical_map,
        logical_count=logical_count,
        ep_rank=ep_rank,
        num_ep_ranks=num_ep_ranks,
        tp_rank=tp_rank,
        num_tp_ranks=num_tp_ranks,
    )
    if unmapped_topk_idx is not None:
        unmapped_topk_idx.copy_(unmapped)
    return idx, weights


def topk_gate(scores: torch.Tensor, num_topk: int) -> torch.Tensor:
    assert scores.dim() == 2 and scores.is_contiguous() and scores.dtype == torch.float32
    assert num_topk <= scores.size(1), f"num_topk ({num_topk}) must be <= num_experts ({scores.size(1)})"
    return ops.topk_gate(scores, num_topk)


def topk_sum_and_topk_group_idx(scores: torch.Tensor, num_topk_sum: int, num_topk_groups: int) -> torch.Tensor:
    assert scores.dim() == 3 and scores.is_contiguous() and scores.dtype == torch.float32
    assert num_topk_sum in (1, 2) and num_topk_sum <= scores.size(2)
    assert num_topk_groups <= scores.size(1)
    return ops.topk_sum_and_topk_group_idx(scores, num_topk_sum, num_topk_groups)


def normalize_weight(topk_weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    assert topk_weights.dim() == 2 and topk_weights.is_contiguous() and topk_weights.dtype == torch.float32
    return ops.normalize_weight(topk_weights)


def _check_ids(api: str, name: str, idx: torch.Tensor, n: int) -> None:
    """Upstream's kernels device-assert ``-1 <= idx < n``; on the CPU the host read is free (skipped while
    compiling, where it would be a data-dependent guard), and an id out of range is named, not a scatter error."""
    if idx.device.type == "cpu" and idx.numel() and not torch.compiler.is_compiling():
        low, high = int(idx.min()), int(idx.max())
        ck.check_arg(low >= -1 and high < n, api, name, "values", f"ids in [-1, {n})", f"ids in [{low}, {high}]")


def aux_fi(topk_idx: torch.Tensor, num_experts: int, num_aux_topk: int) -> torch.Tensor:
    assert topk_idx.dim() == 2 and topk_idx.dtype == torch.int64
    _check_ids("tile_kernels.moe.aux_fi", "topk_idx", topk_idx, num_experts)
    return ops.aux_fi(topk_idx, num_experts, num_aux_topk)


def group_count(group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    assert group_idx.dim() == 2 and group_idx.is_contiguous()
    _check_ids("tile_kernels.moe.group_count", "group_idx", group_idx, num_groups)
    return ops.group_count(group_idx, num_groups)


def mask_indices_by_tp(
    indices: torch.Tensor, n: int, num_ep_ranks: int, tp_rank: int, num_tp_ranks: int
) -> torch.Tensor:
    assert n % num_ep_ranks == 0 and 0 <= tp_rank < num_tp_ranks
    return ops.mask_indices_by_tp(indices, n, num_ep_ranks, tp_rank, num_tp_ranks)


def inplace_unique_group_indices(group_indices: torch.Tensor, num_groups: int) -> None:
    """In place, as upstream: every repeat of a value after its first occurrence in a row becomes -1."""
    assert group_indices.dim() == 2 and group_indices.dtype == torch.int64 and num_groups <= 128
    group_indices.copy_(ops.unique_group_indices(group_indices))
