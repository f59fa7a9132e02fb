"""DeepSeek's Engram n-gram memory gate as TileKernels computes it (specs/tilekernels_deepselect.md §9): the n-gram
hash into the embedding tables and the gate that adds a looked-up value to the residual streams.

Compositions of torch ops (integer products and XORs; two RMS norms, a dot product and a sigmoid per stream), not
ops: differentiable by autograd, traceable, exportable.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

__all__ = ["engram_gate", "engram_hash", "make_offsets"]

HASH, GATE = "torch_ascend_moe.ops.engram.engram_hash", "torch_ascend_moe.ops.engram.engram_gate"
_INTS = (torch.int32, torch.int64)
_INT32_MAX = 2**31 - 1


def _values_checked(*tensors) -> bool:
    """Value checks read the host: eager calls only (a compiled graph keeps the shape and dtype checks)."""
    return not torch.compiler.is_compiling() and all(t.device.type != "meta" for t in tensors)


def _hash_checks(ids, multipliers, vocab_sizes, offsets) -> None:
    """The hash's arguments: integer ids and tables, positive table sizes, and table indices that fit int32 (the
    output's dtype): a float id would be truncated, a size <= 0 gives a negative or undefined index, an offset near
    INT32_MAX wraps negative."""
    ck.check_rank(HASH, "ngram_token_ids", ids, 2, "[T, n]")
    ck.check_rank(HASH, "multipliers", multipliers, 2, "[L, n]")
    ck.check_rank(HASH, "vocab_sizes", vocab_sizes, 3, "[L, n-1, E]")
    ck.check_rank(HASH, "offsets", offsets, 2, "[L, (n-1)*E]")
    for name, t in (("ngram_token_ids", ids), ("multipliers", multipliers), ("vocab_sizes", vocab_sizes),
                    ("offsets", offsets)):  # fmt: skip
        ck.check_arg(t.dtype in _INTS, HASH, name, "dtype", "torch.int32 or torch.int64", t.dtype)
    n, (layers, tables) = ids.shape[1], (vocab_sizes.shape[0], vocab_sizes.shape[2])
    ck.check_arg(n >= 2, HASH, "ngram_token_ids", "size(1) (n)", "at least 2 (an n-gram)", n)
    ck.check_arg(list(multipliers.shape) == [layers, n], HASH, "multipliers", "shape", [layers, n],
                 list(multipliers.shape))  # fmt: skip
    ck.check_arg(
        vocab_sizes.shape[1] == n - 1, HASH, "vocab_sizes", "size(1)", f"{n - 1} (n - 1)", vocab_sizes.shape[1]
    )
    ck.check_arg(list(offsets.shape) == [layers, (n - 1) * tables], HASH, "offsets", "shape",
                 [layers, (n - 1) * tables], list(offsets.shape))  # fmt: skip
    if not _values_checked(vocab_sizes, offsets):
        return
    low = int(vocab_sizes.min()) if vocab_sizes.numel() else 1
    ck.check_arg(low > 0, HASH, "vocab_sizes", "values", "table sizes > 0", low)
    if offsets.numel():
        low, top = int(offsets.min()), int((offsets.to(torch.int64) + vocab_sizes.reshape(layers, -1) - 1).max())
        ck.check_arg(low >= 0, HASH, "offsets", "values", ">= 0", low)
        ck.check_arg(top <= _INT32_MAX, HASH, "offsets", "values", f"offset + table size - 1 <= {_INT32_MAX} (an "
                     "int32 table index)", top)  # fmt: skip


def make_offsets(vocab_sizes: torch.Tensor) -> torch.Tensor:
    """int32 ``[L, (n-1)·E]``: each layer's exclusive prefix sums of its flattened table sizes."""
    flat = vocab_sizes.reshape(vocab_sizes.shape[0], -1).to(torch.int64)
    return (flat.cumsum(1) - flat).to(torch.int32)


def engram_hash(ngram_token_ids: torch.Tensor, multipliers: torch.Tensor, vocab_sizes: torch.Tensor,
                offsets: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """int32 ``[L, T, (n-1)·E]``: per layer ``h = id_0·m_0``, then for ``i = 1 … n-1`` ``h ^= id_i·m_i`` (int64) and
    ``h mod vocab_sizes[l, i-1, :]`` (floor modulo), plus the layer's ``offsets``."""
    _hash_checks(ngram_token_ids, multipliers, vocab_sizes, offsets)
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
    _gate_checks(hidden_states, k, v, weight_fused, clamp_value, eps)
    acc = torch.float64 if hidden_states.dtype == torch.float64 else torch.float32
    x, kf, w = hidden_states.to(acc), k.to(acc), weight_fused.to(acc)
    rstd_x = torch.rsqrt(x.pow(2).mean(-1) + eps)
    rstd_k = torch.rsqrt(kf.pow(2).mean(-1) + eps)
    raw = (x * kf * w).sum(-1)
    d = raw * rstd_x * rstd_k * hidden_states.shape[-1] ** -0.5
    gate = (d.abs().clamp_min(clamp_value).sqrt() * d.sign()).sigmoid()
    out = (x + gate.unsqueeze(-1) * v.to(acc).unsqueeze(-2)).to(hidden_states.dtype)
    return out, raw, gate, rstd_x, rstd_k


def _gate_checks(x, k, v, weight_fused, clamp_value, eps) -> None:
    """The gate's arguments: floating streams of matching shapes, ``eps > 0`` (else ``rsqrt`` of a zero row is inf
    and the gate NaN), a finite ``clamp_value >= 0``."""
    floats = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
    ck.check_arg(x.dtype in floats, GATE, "hidden_states", "dtype", "a floating dtype", x.dtype)
    ck.check_arg(x.dim() >= 2, GATE, "hidden_states", "rank", "[..., hc, H]", lambda: ck.shape_str(x.shape))
    for name, t in (("k", k), ("v", v), ("weight_fused", weight_fused)):
        ck.check_arg(t.dtype in floats, GATE, name, "dtype", "a floating dtype", t.dtype)
        ck.check_arg(t.device == x.device, GATE, name, "device", f"{x.device} (same as 'hidden_states')", t.device)
    ck.check_arg(k.shape == x.shape, GATE, "k", "shape", lambda: ck.shape_str(x.shape), lambda: ck.shape_str(k.shape))
    want_v = [*x.shape[:-2], x.shape[-1]]
    ck.check_arg(list(v.shape) == want_v, GATE, "v", "shape", want_v, list(v.shape))
    ck.check_arg(list(weight_fused.shape) == list(x.shape[-2:]), GATE, "weight_fused", "shape", list(x.shape[-2:]),
                 list(weight_fused.shape))  # fmt: skip
    ck.check_arg(isinstance(eps, (int, float)) and eps > 0, GATE, "eps", "value", "> 0", eps)
    ck.check_arg(isinstance(clamp_value, (int, float)) and 0 <= clamp_value < float("inf"), GATE, "clamp_value",
                 "value", "a finite number >= 0", clamp_value)  # fmt: skip
