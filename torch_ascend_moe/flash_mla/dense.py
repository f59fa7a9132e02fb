"""FlashMLA's dense MHA prefill (``flash_attn_varlen_func`` and its packed forms; upstream: SM100 only), written
with torch ops so code calling it runs anywhere: per sequence of the varlen batch, ``softmax(scale * q k^T) v``
in FP32 with one rounding to q's dtype, causal masks bottom-right aligned (query ``r`` of ``s_q`` sees key ``c`` of
``s_k`` iff ``c <= s_k - s_q + r``), grouped-query heads (``h_q`` a multiple of ``h_kv``), natural-log ``lse``
``[total_q, h_q]`` FP32 with upstream's strides ``(1, total_q)``; a query that sees no key gets out 0, lse +inf.
Differentiable through autograd (GQA backward included, which upstream refuses); memory ``O(h * s_q * s_k)`` per
sequence: a compatibility path, not a kernel (specs/flashmla_api.md §6).
"""

from __future__ import annotations

import math

import torch

_API = "flash_mla.flash_attn_varlen_func"


def _check(cond: bool, arg: str, expected: str, actual) -> None:
    if not cond:
        raise ValueError(f"{_API}: argument '{arg}': expected {expected}, got {actual}")


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_qo: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    max_seqlen_qo: int,
    max_seqlen_kv: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    deterministic: bool = False,
    is_varlen: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [total_q, h_q, d_v], lse [total_q, h_q])`` for ``q [total_q, h_q, d_qk]``, ``k [total_k, h_kv, d_qk]``,
    ``v [total_k, h_kv, d_v]`` and int32 prefix sums ``cu_seqlens_qo`` / ``cu_seqlens_kv`` ``[b + 1]``."""
    _check(dropout_p == 0.0, "dropout_p", "0.0 (no dropout, as upstream)", dropout_p)
    _check(not deterministic, "deterministic", "False (as upstream)", deterministic)
    _check(is_varlen, "is_varlen", "True (packed varlen tensors)", is_varlen)
    _check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "q", "3-D [total, heads, dim] q, k and v", q.dim())
    _check(k.shape[:2] == v.shape[:2], "v", f"[total_k, h_kv] = {list(k.shape[:2])}", list(v.shape[:2]))
    _check(q.shape[2] == k.shape[2], "k", f"head dim {q.shape[2]} (q's)", k.shape[2])
    _check(q.shape[1] % k.shape[1] == 0, "k", f"a head count dividing h_q = {q.shape[1]}", k.shape[1])
    _check(cu_seqlens_qo.shape == cu_seqlens_kv.shape, "cu_seqlens_kv", "as many sequences as cu_seqlens_qo", None)
    group, scale = q.shape[1] // k.shape[1], softmax_scale if softmax_scale is not None else q.shape[2] ** -0.5
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    outs, lses = [], []
    bounds_q, bounds_k = cu_seqlens_qo.tolist(), cu_seqlens_kv.tolist()
    for (q0, q1), (k0, k1) in zip(zip(bounds_q, bounds_q[1:]), zip(bounds_k, bounds_k[1:])):
        qs = q[q0:q1].to(acc).transpose(0, 1)  # [h_q, s_q, d]
        ks = k[k0:k1].to(acc).transpose(0, 1).repeat_interleave(group, dim=0)
        vs = v[k0:k1].to(acc).transpose(0, 1).repeat_interleave(group, dim=0)
        scores = scale * qs @ ks.transpose(1, 2)  # [h_q, s_q, s_k]
        if causal:
            s_q, s_k = q1 - q0, k1 - k0
            rows = torch.arange(s_q, device=q.device)[:, None]
            cols = torch.arange(s_k, device=q.device)[None, :]
            scores = scores.masked_fill(cols > s_k - s_q + rows, -math.inf)
        lse = torch.logsumexp(scores, dim=-1)  # -inf where a query sees nothing
        lonely = lse == -math.inf
        p = torch.where(lonely[..., None], 0.0, torch.exp(scores - lse[..., None]))
        outs.append((p @ vs).transpose(0, 1))
        lses.append(torch.where(lonely, math.inf, lse))
    out = torch.cat(outs) if outs else q.new_zeros(0, q.shape[1], v.shape[2], dtype=acc)
    lse = torch.cat(lses, dim=1) if lses else q.new_zeros(q.shape[1], 0, dtype=acc)
    return out.to(q.dtype), lse.to(torch.float32 if acc == torch.float32 else acc).t()


def flash_attn_varlen_qkvpacked_func(
    qkv: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    head_dim_qk: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    deterministic: bool = False,
    is_varlen: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``qkv [total, h, 2 * head_dim_qk + d_v]`` split as ``[:d], [d:2d], [2d:]``."""
    d = head_dim_qk
    q, k, v = qkv[..., :d], qkv[..., d : 2 * d], qkv[..., 2 * d :]
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale, causal, deterministic,
        is_varlen,
    )  # fmt: skip


def flash_attn_varlen_kvpacked_func(
    q: torch.Tensor,
    kv: torch.Tensor,
    cu_seqlens_qo: torch.Tensor,
    cu_seqlens_kv: torch.Tensor,
    max_seqlen_qo: int,
    max_seqlen_kv: int,
    head_dim_qk: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    deterministic: bool = False,
    is_varlen: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``kv [total_k, h_kv, head_dim_qk + d_v]`` split as ``[:d], [d:]``."""
    k, v = kv[..., :head_dim_qk], kv[..., head_dim_qk:]
    return flash_attn_varlen_func(
        q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, dropout_p, softmax_scale, causal,
        deterministic, is_varlen,
    )  # fmt: skip
