"""``tile_kernels.engram``: TileKernels' Engram kernels over ``torch_ascend_moe.ops.engram`` with upstream's
signatures: ``engram_hash``, ``fused_weight``, ``engram_gate_fwd`` / ``engram_gate_bwd`` (the backward differentiates
the forward's formula at the saved statistics; its weight gradient comes as one partial block) and
``grad_w_reduce`` (accumulating into the given gradients)."""

from __future__ import annotations

import torch

from torch_ascend_moe.ops import engram as ops

__all__ = ["engram_gate_bwd", "engram_gate_fwd", "engram_hash", "fused_weight", "grad_w_reduce"]


def engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets) -> torch.Tensor:
    return ops.engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets)


def fused_weight(weight_hidden: torch.Tensor, weight_embed: torch.Tensor) -> torch.Tensor:
    """``float(weight_hidden) · float(weight_embed)``, FP32 ``[hc, H]``."""
    return weight_hidden.float() * weight_embed.float()


def engram_gate_fwd(hidden_states, k, v, weight_fused, eps: float, clamp_value: float, save_for_backward: bool = True):
    """``(out, raw_dot, gate_score, rstd_x, rstd_k)`` (the last four None without ``save_for_backward``)."""
    assert k.stride(-1) == 1 and v.stride(-1) == 1
    with torch.no_grad():
        out, raw, gate, rstd_x, rstd_k = ops.engram_gate(hidden_states, k, v, weight_fused, clamp_value, eps)
    if not save_for_backward:
        return out, None, None, None, None
    return out, raw, gate, rstd_x, rstd_k


def engram_gate_bwd(grad_out, hidden_states, k, v, weight_fused, dot, gate_score, rstd_x, rstd_k, clamp_value: float):
    """``(grad_hidden_states, grad_k, grad_v, grad_w_partial [1, hc, H])`` from the forward's saved ``dot`` (the raw
    dot product), ``gate_score`` and ``rstd_x`` / ``rstd_k``."""
    assert k.stride(-1) == 1 and v.stride(-1) == 1
    hidden = hidden_states.shape[-1]
    with torch.enable_grad():
        x = hidden_states.detach().float().requires_grad_()
        kf = k.detach().float().requires_grad_()
        vf = v.detach().float().requires_grad_()
        w = weight_fused.detach().float().requires_grad_()
        rx, rk = _saved_rstd(x, rstd_x), _saved_rstd(kf, rstd_k)
        raw = (x * kf * w).sum(-1)
        raw = raw + (dot - raw).detach()
        d = raw * rx * rk * hidden**-0.5
        gate = (d.abs().clamp_min(clamp_value).sqrt() * d.sign()).sigmoid()
        out = x + gate.unsqueeze(-1) * vf.unsqueeze(-2)
        gx, gk, gv, gw = torch.autograd.grad(out, (x, kf, vf, w), grad_out.float())
    return gx.to(hidden_states.dtype), gk.to(k.dtype), gv.to(v.dtype), gw.unsqueeze(0)


def _saved_rstd(x: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """``rstd`` as a value whose gradient is ``rsqrt(mean(x²) + eps)``'s, ``−rstd³·x/H`` (which needs no eps; the
    kernel API does not pass it to the backward)."""
    r = rstd.detach().float()
    squares = x.pow(2).sum(-1)
    return r - (r.pow(3) / (2 * x.shape[-1])) * (squares - squares.detach())


def grad_w_reduce(grad_w_partial, weight_hidden, weight_embed, grad_weight_hidden, grad_weight_embed) -> None:
    """``grad_weight_hidden += Σ_blocks partial · weight_embed``, ``grad_weight_embed += Σ partial · weight_hidden``
    (FP32, in place)."""
    total = grad_w_partial.sum(0)
    grad_weight_hidden += total * weight_embed.float()
    grad_weight_embed += total * weight_hidden.float()
