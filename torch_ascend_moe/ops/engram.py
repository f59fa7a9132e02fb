"""DeepSeek's Engram n-gram memory gate as TileKernels computes it (specs/tilekernels_deepselect.md §9): the n-gram
hash into the embedding tables and the gate that adds a looked-up value to the residual streams.

Compositions of torch ops (integer products and XORs; two RMS norms, a dot product and a sigmoid per stream), not
ops: differentiable by autograd, traceable, exportable.
"""

from __future__ import annotations

import torch

__all__ = ["engram_gate", "engram_hash", "make_offsets"]


def make_offsets(vocab_sizes: torch.Tensor) -> torch.Tensor:
    """int32 ``[L, (n-1)·E]``: each layer's exclusive prefix sums of its flattened table sizes."""
    flat = vocab_sizes.reshape(vocab_sizes.shape[0], -1).to(torch.int64)
    return (flat.cumsum(1) - flat).to(torch.int32)


def engram_hash(ngram_token_ids: torch.Tensor, multipliers: torch.Tensor, vocab_sizes: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """int32 ``[L, T, (n-1)·E]``: per layer ``h = id_0·m_0``, then for ``i = 1 … n-1`` ``h ^= id_i·m_i`` (int64) and
    ``h mod vocab_sizes[l, i-1, :]`` (floor modulo), plus the layer's ``offsets``."""
    prod = ngram_token_ids.to(torch.int64).unsqueeze(0) * multipliers.to(torch.int64).unsqueeze(1)  # [L, T, n]
    h = prod[..., 0]
    columns = []
    for i in range(1, multipliers.shape[1]):
        h = h ^ prod[..., i]
        columns.append(h.unsqueeze(-1) % vocab_sizes[:, i - 1].to(torch.int64).unsqueeze(1))
    return (torch.cat(columns, dim=-1) + offsets.to(torch.int64).unsqueeze(1)).to(torch.int32)


def engram_gate(hidden_states: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weight_fused: torch.Tensor,
                clamp_value: float, eps: float):  # fmt: skip
    """``(out, raw_dot, gate, rstd_x, rstd_k)`` for ``hidden_states`` / ``k`` ``[..., hc, H]``, ``v [..., H]``,
    ``weight_fused [hc, H]`` (the two RMSNorm weights' product, FP32): ``rstd = rsqrt(mean(·²) + eps)`` of x and k,
    ``raw_dot = Σ x·k·w``, ``d = raw_dot·rstd_x·rstd_k/√H``, ``gate = sigmoid(sign(d)·sqrt(max(|d|, clamp)))``,
    ``out = x + gate·v`` in FP32, rounded to x's dtype."""
    acc = torch.float64 if hidden_states.dtype == torch.float64 else torch.float32
    x, kf, w = hidden_states.to(acc), k.to(acc), weight_fused.to(acc)
    rstd_x = torch.rsqrt(x.pow(2).mean(-1) + eps)
    rstd_k = torch.rsqrt(kf.pow(2).mean(-1) + eps)
    raw = (x * kf * w).sum(-1)
    d = raw * rstd_x * rstd_k * hidden_states.shape[-1] ** -0.5
    gate = (d.abs().clamp_min(clamp_value).sqrt() * d.sign()).sigmoid()
    out = (x + gate.unsqueeze(-1) * v.to(acc).unsqueeze(-2)).to(hidden_states.dtype)
    return out, raw, gate, rstd_x, rstd_k
