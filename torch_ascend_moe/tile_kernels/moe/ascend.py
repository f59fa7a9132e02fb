"""TileKernels' Ascend-era gate API (specs/tilekernels_deepselect.md §10.2-§10.3): ``moe_topk_gate_forward`` (also
``moe_topk_gate``) over the ``moe_topk_gate`` op (sqrt-softplus scores, no groups, the ``+ 1e-20`` denominator, no
EP/TP masking) and ``moe_topk_gate_backward``, its analytic gradient with the sequence-level aux-loss term, with
upstream's signatures, asserts and out-parameters.

``force_random`` rows (a load test's random routing; upstream's docstring: "random topk idx, weights and all -1
unmapped topk idx") get, as the Ascend-era kernel: all ``k + S'`` slots distinct physical ids drawn uniformly from
``[0, sum(logical_count))`` (``[0, E + S')`` without a map; no map applied after), weights uniform in ``(0, 1]``,
scores 0 and unmapped indices -1 (torch's generator draws them).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.ops import moe_gate as ops

__all__ = ["check_gate_buffers", "moe_topk_gate", "moe_topk_gate_backward", "moe_topk_gate_forward"]


def check_gate_buffers(to_physical_map, logical_count, logical_experts: int, unmapped_topk_idx, num_tokens: int,
                       num_topk: int) -> None:  # fmt: skip
    """Both gate APIs' asserts on the physical map, its counts and the unmapped-index buffer."""
    if to_physical_map is not None:
        assert to_physical_map.is_contiguous() and to_physical_map.dim() == 2 and to_physical_map.dtype == torch.int32
        assert to_physical_map.size(0) == logical_experts
        assert logical_count.is_contiguous() and logical_count.dim() == 1 and logical_count.dtype == torch.int32
        assert logical_count.size(0) == logical_experts
    if unmapped_topk_idx is not None:
        assert unmapped_topk_idx.dim() == 2 and unmapped_topk_idx.dtype == torch.int64
        assert tuple(unmapped_topk_idx.shape) == (num_tokens, num_topk) and unmapped_topk_idx.stride(1) == 1


def _check_forward(logits, num_topk, use_shared_as_routed, num_shared_experts, bias, image_bias, image_token_mask,
                   mask, to_physical_map, logical_count, unmapped_topk_idx, fix_routing_mask,
                   scores) -> int:  # fmt: skip
    assert logits.dim() == 2 and logits.is_contiguous() and logits.dtype == torch.float32
    num_tokens, experts = logits.shape
    if bias is not None:
        assert bias.dim() == 1 and bias.is_contiguous() and bias.dtype == torch.float32 and bias.size(0) == experts
    assert (image_token_mask is None) == (image_bias is None), (
        "image_bias and image_token_mask must be both provided or both None"
    )
    if image_bias is not None:
        assert image_bias.dim() == 1 and image_bias.dtype == torch.float32 and image_bias.size(0) == experts
        assert image_token_mask.dim() == 1 and image_token_mask.dtype == torch.bool
        assert image_token_mask.size(0) == num_tokens
    if mask is not None:
        assert mask.numel() == num_tokens and mask.dtype == torch.bool
    assert (to_physical_map is None) == (logical_count is None)
    assert num_topk <= experts, f"num_topk ({num_topk}) must be less than or equal to num_routed_experts ({experts})."
    shared = num_shared_experts if use_shared_as_routed else 0
    assert shared in {1, 2} or (shared == 0 and not use_shared_as_routed)
    check_gate_buffers(to_physical_map, logical_count, experts + shared, unmapped_topk_idx, num_tokens, num_topk)
    if fix_routing_mask is not None:
        assert unmapped_topk_idx is not None
        assert fix_routing_mask.is_contiguous() and fix_routing_mask.dtype == torch.bool
        assert fix_routing_mask.dim() == 1 and fix_routing_mask.size(0) == num_tokens
    if scores is not None:
        assert scores.size() == logits.size() and scores.dtype == torch.float32 and scores.is_contiguous()
    return shared


def moe_topk_gate_forward(logits: torch.Tensor, num_topk: int, use_shared_as_routed: bool, num_shared_experts: int,
                          routed_scaling_factor: float, ep_rank: int, scoring_func: str = "sqrtsoftplus", mask=None,
                          bias=None, image_bias=None, image_token_mask=None, fix_routing_mask=None,
                          to_physical_map=None, logical_count=None, unmapped_topk_idx=None, force_random=None,
                          out=None, scores=None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(topk_idx int64 [T, k + S'], topk_weights fp32 [T, k + S'])``; ``unmapped_topk_idx`` (in/out) receives the
    routed experts before mapping, ``scores`` (when given) the sqrt-softplus scores, ``out`` the results."""
    assert scoring_func == "sqrtsoftplus", (
        f"moe_topk_gate_forward only supports sqrtsoftplus scoring, got {scoring_func!r}"
    )
    shared = _check_forward(
        logits, num_topk, use_shared_as_routed, num_shared_experts, bias, image_bias, image_token_mask, mask,
        to_physical_map, logical_count, unmapped_topk_idx, fix_routing_mask, scores,
    )  # fmt: skip
    num_tokens, experts = logits.shape
    if force_random is not None:
        assert force_random.dim() == 1 and force_random.size(0) == num_tokens and force_random.dtype == torch.bool
    weights, idx, unmapped, u = ops.moe_topk_gate(
        logits, bias, num_topk, scoring_func="sqrtsoftplus", routed_scaling_factor=routed_scaling_factor,
        num_shared_experts=shared, mask=mask, fix_routing_mask=fix_routing_mask, unmapped_topk_idx=unmapped_topk_idx,
        to_physical_map=to_physical_map, logical_count=logical_count, ep_rank=ep_rank, num_ep_ranks=ep_rank + 1,
        image_bias=image_bias, image_token_mask=image_token_mask, clamp_denominator=False,
    )  # fmt: skip
    if force_random is not None:
        rows = (force_random if mask is None else force_random & mask)[:, None]
        slots = idx.shape[1]
        physical = int(logical_count.sum()) if logical_count is not None else experts + slots - num_topk
        assert slots <= physical, f"force_random needs {slots} distinct physical experts, only {physical} exist"
        drawn = torch.rand(num_tokens, physical, device=logits.device).argsort(dim=1)[:, :slots]
        idx = torch.where(rows, drawn, idx)
        weights = torch.where(rows, 1.0 - torch.rand(num_tokens, slots, device=logits.device), weights)
        unmapped, u = torch.where(rows, -1, unmapped), torch.where(rows, 0.0, u)
    if unmapped_topk_idx is not None:
        unmapped_topk_idx.copy_(unmapped)
    if scores is not None:
        scores.copy_(u)
    if out is None:
        return idx, weights
    out_idx, out_weights = out
    assert out_idx.size() == idx.size() and out_idx.dtype == torch.int64
    assert out_weights.size() == weights.size() and out_weights.dtype == torch.float32
    out_idx.copy_(idx)
    out_weights.copy_(weights)
    return out_idx, out_weights


def moe_topk_gate(*args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """The original name of ``moe_topk_gate_forward``."""
    return moe_topk_gate_forward(*args, **kwargs)


def moe_topk_gate_backward(scores: torch.Tensor, topk_idx: torch.Tensor, topk_weights: torch.Tensor,
                           grad_topk_weights: torch.Tensor, routed_scaling_factor: float,
                           scoring_func: str = "sqrtsoftplus", mask=None, grad_scores_sum=None,
                           out=None) -> torch.Tensor:  # fmt: skip
    """``∂L/∂logits`` FP32 ``[T, E]`` from the scores ``u``: with ``D = Σ_j u[idx_j] + 1e-20`` over the valid
    (``idx >= 0``) routed slots, ``∂L/∂u[idx_j] += (s·g_j − Σ_i g_i·w_i) / D`` (duplicates accumulate); with
    ``grad_scores_sum [num_seqs, E]`` (rows repeat per sequence) the aux term ``(h − Σ_e h_e·u_e / Σu) / Σu`` on
    ``mask`` rows; then ``· (1 − exp(−u²)) / (2u)`` (0 at u = 0). Computed in FP64."""
    assert scoring_func == "sqrtsoftplus", (
        f"moe_topk_gate_backward only supports sqrtsoftplus scoring, got {scoring_func!r}"
    )
    assert scores.dim() == 2 and scores.dtype == torch.float32
    assert topk_idx.shape == topk_weights.shape == grad_topk_weights.shape and topk_idx.size(0) == scores.size(0)
    u = scores.double()
    valid = topk_idx >= 0
    idx = topk_idx.long().clamp(min=0)
    u_j = u.gather(1, idx) * valid
    g = grad_topk_weights.double() * valid
    route = (routed_scaling_factor * g - (g * topk_weights.double()).sum(-1, keepdim=True)) / (
        u_j.sum(-1, keepdim=True) + 1e-20
    ) * valid  # fmt: skip
    grad_u = torch.zeros_like(u).scatter_add_(1, idx, route)
    if grad_scores_sum is not None:
        assert mask is not None, "grad_scores_sum needs the mask of the rows it covers"
        num_seqs = grad_scores_sum.shape[0]
        assert u.shape[0] % num_seqs == 0
        h = grad_scores_sum.double().repeat_interleave(u.shape[0] // num_seqs, dim=0)
        total = u.sum(-1, keepdim=True)
        rows = mask.reshape(-1, 1)
        inv = rows / torch.where(rows, total, torch.ones_like(total))
        grad_u = grad_u + (h - (h * u).sum(-1, keepdim=True) * inv) * inv
    result = (torch.where(u > 0, -torch.expm1(-u * u) / (2 * u), 0.0) * grad_u).float()
    return result if out is None else out.copy_(result)
