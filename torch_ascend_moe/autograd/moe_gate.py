"""Backward of ``moe_topk_gate`` (TileKernels' analytic ``moe_topk_gate_backward``, for every scoring function):
with ``u`` the scores, the routed slots' ``w_j = s·u[idx_j] / D`` (``D`` = the sum of the slots' u, clamped at or
offset by 1e-20), ``∂L/∂u[i] += (s·Σ_{j: idx_j = i} g_j − Σ_j g_j·w_j) / D`` (no second term where the clamp
holds ``D`` at 1e-20), plus the gradient of the ``scores`` output; then through the scoring function:
sigmoid ``u(1−u)``, sqrt-softplus ``(1 − exp(−u²)) / (2u)`` (0 at u = 0), softmax ``u ⊙ (g − Σ g·u)``. Ranking
(bias, groups) selects and carries no gradient; shared slots are constants."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients


def _setup(ctx, inputs, output):
    args = arguments("moe_topk_gate", inputs)
    _, _, unmapped, scores = output
    ctx.num_topk = args.num_topk
    ctx.scale = args.routed_scaling_factor
    ctx.scoring = args.scoring_func
    ctx.clamp = args.clamp_denominator
    active = torch.ones_like(scores[:, 0], dtype=torch.bool) if args.mask is None else args.mask
    ctx.save_for_backward(unmapped, scores, active)


def _backward(ctx, grad_weights, grad_idx, grad_unmapped, grad_scores):
    unmapped, u, active = ctx.saved_tensors
    grad_u = torch.zeros_like(u) if grad_scores is None else grad_scores.clone()
    if grad_weights is not None:
        # An active row's routed slots read u at its unmapped indices (a fixed -1 slot reads column 0, as the forward).
        cols = unmapped.clamp(min=0)
        s = u.gather(1, cols)
        total = s.sum(-1, keepdim=True)
        denominator = total.clamp(min=1e-20) if ctx.clamp else total + 1e-20
        g = torch.where(active[:, None], grad_weights[:, : ctx.num_topk], 0)
        through_sum = (g * s / denominator * ctx.scale).sum(-1, keepdim=True)
        if ctx.clamp:  # a clamped denominator is a constant
            through_sum = torch.where(total > 1e-20, through_sum, 0)
        grad_u = grad_u.scatter_add(1, cols, (ctx.scale * g - through_sum) / denominator)
    if ctx.scoring == "sigmoid":
        grad_logits = grad_u * u * (1 - u)
    elif ctx.scoring == "sqrtsoftplus":
        grad_logits = torch.where(u > 0, grad_u * -torch.expm1(-u * u) / (2 * u), 0)
    elif ctx.scoring == "identity":
        grad_logits = grad_u
    else:
        grad_logits = u * (grad_u - (grad_u * u).sum(-1, keepdim=True))
    return gradients("moe_topk_gate", logits=grad_logits)


autograd("moe_topk_gate", _backward, _setup)
