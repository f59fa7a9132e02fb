"""Backward of the moe_routing family, with static shapes (no data-dependent sizes in compiled graphs).

``moe_permute`` copies rows, so its gradient sums the copies back: ``moe_unpermute`` without weights.
``moe_unpermute``: ``dy[row_map[t, j]] = w[t, j] * dout[t]`` (an index_add into a buffer with one spare
row that unrouted pairs point at), ``dw[t, j] = <dout[t], y[row_map[t, j]]>`` and ``dbias = dout``.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad
from torch_ascend_moe.ops.moe_routing import moe_unpermute
from torch_ascend_moe.routing_math import gate_scores


def _permute_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.x_dtype = arguments("moe_permute", inputs).x.dtype


def _permute_backward(ctx, grad, grad_row_map, grad_offs):
    (row_map,) = ctx.saved_tensors
    grad_x = moe_unpermute(grad.to(ctx.x_dtype), row_map) if needs_grad(ctx, "moe_permute", "x") else None
    return gradients("moe_permute", x=grad_x)


def _unpermute_setup(ctx, inputs, output):
    args = arguments("moe_unpermute", inputs)
    y, weights = args.y, args.topk_weights
    ctx.has_weights = weights is not None
    ctx.bias_dtype = None if args.bias is None else args.bias.dtype
    ctx.save_for_backward(y, args.row_map, weights if weights is not None else y.new_empty(0))


def _unpermute_backward(ctx, grad):
    y, row_map, weights = ctx.saved_tensors
    acc_t = torch.float64 if y.dtype == torch.float64 else torch.float32
    rows = y.shape[0]
    idx = torch.where(row_map >= 0, row_map.long(), rows)  # unrouted pairs -> the spare row
    g = grad.to(acc_t)
    grad_y = grad_w = None
    if needs_grad(ctx, "moe_unpermute", "y"):
        contrib = g.unsqueeze(1).expand(-1, row_map.shape[1], -1)
        if ctx.has_weights:
            contrib = contrib * weights.to(acc_t).unsqueeze(-1)
        buf = torch.zeros(rows + 1, y.shape[1], dtype=acc_t, device=y.device)
        buf.index_add_(0, idx.flatten(), contrib.reshape(-1, y.shape[1]))
        grad_y = buf[:rows].to(y.dtype)
    if ctx.has_weights and needs_grad(ctx, "moe_unpermute", "topk_weights"):
        padded = torch.cat([y.to(acc_t), y.new_zeros(1, y.shape[1], dtype=acc_t)])
        grad_w = (padded[idx] * g.unsqueeze(1)).sum(-1).to(weights.dtype)
    grad_bias = None
    if ctx.bias_dtype is not None and needs_grad(ctx, "moe_unpermute", "bias"):
        grad_bias = grad.to(ctx.bias_dtype)  # the bias enters the sum once, unweighted
    return gradients("moe_unpermute", y=grad_y, topk_weights=grad_w, bias=grad_bias)


autograd("moe_permute", _permute_backward, _permute_setup)
autograd("moe_unpermute", _unpermute_backward, _unpermute_setup)


# moe_gating_topk: the weights are scores at the chosen experts, renormalized and scaled; the choice itself
# (indices, and the bias that only steers it) has no gradient. With w = c * g / (sum(g) + eps), g = scores[idx]:
# dg = c * (dw - sum(dw * w) / c) / (sum(g) + eps) when renormalized, and dscores = scatter(dg); then the
# softmax / sigmoid backward. Written in torch ops, so it differentiates again.


def _gating_setup(ctx, inputs, output):
    args = arguments("moe_gating_topk", inputs)
    ctx.score_func, ctx.renormalize, ctx.scale = args.score_func, args.renormalize, args.routed_scaling_factor
    ctx.logits_dtype = args.logits.dtype
    ctx.save_for_backward(args.logits, output[1])


def _gating_backward(ctx, grad_w, grad_idx):
    logits, idx = ctx.saved_tensors
    if grad_w is None or not needs_grad(ctx, "moe_gating_topk", "logits"):
        return gradients("moe_gating_topk")
    acc = torch.float64 if logits.dtype == torch.float64 else torch.float32
    scores = gate_scores(logits.to(acc), ctx.score_func)
    g = scores.gather(1, idx)
    dg = grad_w.to(acc) * ctx.scale
    if ctx.renormalize:
        denom = g.sum(-1, keepdim=True) + 1e-20
        dg = (dg - (dg * g).sum(-1, keepdim=True) / denom) / denom
    d_scores = torch.zeros_like(scores).scatter_add_(1, idx, dg)
    if ctx.score_func == "sigmoid":
        d_logits = d_scores * scores * (1 - scores)
    else:
        d_logits = scores * (d_scores - (d_scores * scores).sum(-1, keepdim=True))
    return gradients("moe_gating_topk", logits=d_logits.to(ctx.logits_dtype))


autograd("moe_gating_topk", _gating_backward, _gating_setup)
