"""The moe_routing family: tokens into expert-contiguous order for the grouped GEMMs, and back."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_permute = torch.ops.ascend_moe.moe_permute.default
_unpermute = torch.ops.ascend_moe.moe_unpermute.default
_gating = torch.ops.ascend_moe.moe_gating_topk.default


@schema_defaults
def moe_permute(
    x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, *, alignment: int = FROM_SCHEMA
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copy each token once per chosen expert into that expert's segment: ``(permuted, row_map, offs)``.

    ``permuted`` has the static capacity ``T*k + (E-1)*(alignment-1)`` rows (padding rows zero);
    ``row_map[t, j]`` is the row of ``(t, j)`` (``-1`` where ``topk_idx`` is ``-1``); ``offs`` holds the
    cumulative segment ends, i.e. the psum layout of ``m_grouped_bf16_gemm`` with the same ``alignment``.

    >>> out, row_map, offs = moe_permute(torch.randn(3, 4), torch.tensor([[1, 0], [1, -1], [0, 1]]), 2)
    >>> row_map.tolist(), offs.tolist()
    ([[2, 0], [3, -1], [1, 4]], [2, 5])
    """
    return _permute(x, topk_idx, num_experts, alignment)


def moe_unpermute(
    y: torch.Tensor, row_map: torch.Tensor, topk_weights: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``out[t] = bias[t] + sum_j topk_weights[t, j] * y[row_map[t, j]]``: the weighted combine after the experts,
    in FP32 (FP64 for FP64 ``y``) from ``bias [T, H]`` (a residual or the shared experts' output: one rounding for
    the whole sum), slot by slot, in ``y``'s dtype.

    >>> y = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> moe_unpermute(y, torch.tensor([[1, 0]], dtype=torch.int32), bias=torch.ones(1, 2)).tolist()
    [[5.0, 7.0]]
    """
    return _unpermute(y, row_map, topk_weights, bias)


@schema_defaults
def moe_gating_topk(
    logits: torch.Tensor,
    topk: int,
    *,
    bias: torch.Tensor | None = None,
    score_func: str = FROM_SCHEMA,
    num_groups: int = FROM_SCHEMA,
    topk_groups: int = FROM_SCHEMA,
    renormalize: bool = FROM_SCHEMA,
    routed_scaling_factor: float = FROM_SCHEMA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MoE gating: ``(topk_idx int64 [T, k], topk_weights [T, k])`` from router ``logits [T, E]`` (the op
    ``torch.ops.ascend_moe.moe_gating_topk`` returns them the other way round, as torch_npu's gating op).

    Mixtral / Qwen-MoE: ``score_func="softmax"`` (``renormalize`` = ``norm_topk_prob``). DeepSeek-V3:
    ``score_func="sigmoid"``, ``bias=e_score_correction_bias`` (steers the choice only), ``num_groups=n_group``,
    ``topk_groups=topk_group`` (group-limited routing), ``routed_scaling_factor``. Best expert first, ties to
    the lower index; computed in FP32 (FP64 for FP64 logits). The weights are differentiable w.r.t. the logits.
    A ``topk`` above the kept groups' experts takes every one of them, then the best of the others (as
    transformers' DeepSeek-V3 router takes some of its masked experts).

    >>> idx, w = moe_gating_topk(torch.tensor([[0.0, 2.0, 1.0, 2.0]]), 2)
    >>> idx.tolist(), [round(v, 4) for v in w[0].tolist()]
    ([[1, 3]], [0.5, 0.5])
    """
    weights, idx = _gating(logits, topk, bias, score_func, num_groups, topk_groups, renormalize, routed_scaling_factor)
    return idx, weights
