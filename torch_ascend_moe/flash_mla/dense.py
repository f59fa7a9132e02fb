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

from torch_ascend_moe import checks as ck
from torch_ascend_moe.ops.sparse_mla import sparse_mla_prefill

_API = "flash_mla.flash_attn_varlen_func"


def _check(cond: bool, arg: str, expected: str, actual, api: str = _API) -> None:
    if not cond:
        raise ValueError(f"{api}: argument '{arg}': expected {expected}, got {actual}")


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
    # Upstream asserts these two (its other checks are the kernel's).
    assert dropout_p == 0.0, ck.message(_API, "dropout_p", "value", "0.0 (no dropout, as upstream)", dropout_p)
    assert not deterministic, ck.message(_API, "deterministic", "value", "False (as upstream)", deterministic)
    _check(q.dim() == 3 and k.dim() == 3 and v.dim() == 3, "q", "3-D [total, heads, dim] q, k and v", q.dim())
    _check(k.shape[:2] == v.shape[:2], "v", f"[total_k, h_kv] = {list(k.shape[:2])}", list(v.shape[:2]))
    _check(q.shape[2] == k.shape[2], "k", f"head dim {q.shape[2]} (q's)", k.shape[2])
    _check(q.shape[1] % k.shape[1] == 0, "k", f"a head count dividing h_q = {q.shape[1]}", k.shape[1])
    _check(cu_seqlens_qo.shape == cu_seqlens_kv.shape, "cu_seqlens_kv", "as many sequences as cu_seqlens_qo", None)
    group, scale = q.shape[1] // k.shape[1], softmax_scale if softmax_scale is not None else q.shape[2] ** -0.5
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    outs, lses = [], []
    bounds_q, bounds_k = cu_seqlens_qo.tolist(), cu_seqlens_kv.tolist()
    if not is_varlen:  # upstream's fixed-length kernel: every sequence max_seqlen long (then the same attention)
        uniform = all(b - a == max_seqlen_qo for a, b in zip(bounds_q, bounds_q[1:])) and all(
            b - a == max_seqlen_kv for a, b in zip(bounds_k, bounds_k[1:])
        )
        _check(uniform, "is_varlen", "True unless every sequence has max_seqlen_qo / max_seqlen_kv tokens", False)
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


_DECODE_API = "flash_mla.flash_mla_with_kvcache"


def _check_decode(cond: bool, arg: str, expected: str, actual) -> None:
    _check(cond, arg, expected, actual, _DECODE_API)


def dense_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor,
    cache_seqlens: torch.Tensor,
    head_dim_v: int,
    softmax_scale: float,
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``flash_mla_with_kvcache``'s dense mode (DeepSeek-V3/V3.1 MLA decode, specs/flashmla_api.md §4.3):
    ``q [b, s_q, h_q, d]`` over each request's first ``cache_seqlens[b]`` tokens of the paged ``k_cache [blocks,
    page_block_size, h_kv, d]`` (logical block ``p`` of request ``b`` is ``block_table[b, p]``; slots past the
    length are never read), V the first ``head_dim_v`` columns, GQA by head groups, causal bottom-right aligned.
    ``(out [b, s_q, h_q, head_dim_v], lse [b, h_q, s_q])``, a query that sees no key: out 0, lse +inf.

    The ``sparse_mla_prefill`` op over each kv head's rows with the request's positions as the indices (the causal
    limit is its ``topk_length``), so it runs the op's kernels, autograd, compile and export; memory O(b * s_q *
    max length) for the indices."""
    _check_decode(q.dim() == 4, "q", "4-D [b, s_q, h_q, d]", list(q.shape))
    _check_decode(k_cache.dim() == 4, "k_cache", "4-D [num_blocks, page_block_size, h_kv, d]", list(k_cache.shape))
    _check_decode(k_cache.dtype == q.dtype, "k_cache", f"dtype {q.dtype} (q's: a BF16/FP16 cache)", k_cache.dtype)
    b, s_q, h_q, d = q.shape
    blocks, page, h_kv, _ = k_cache.shape
    _check_decode(k_cache.shape[3] == d, "k_cache", f"size(3) {d} (q's head dim)", k_cache.shape[3])
    _check_decode(h_kv > 0 and h_q % h_kv == 0, "k_cache", f"a head count dividing h_q = {h_q}", h_kv)
    _check_decode(0 < head_dim_v <= d, "head_dim_v", f"in [1, {d}]", head_dim_v)
    _check_decode(
        block_table.dim() == 2 and block_table.shape[0] == b and block_table.dtype == torch.int32,
        "block_table", f"int32 [b = {b}, max_blocks_per_seq]", f"{block_table.dtype} {list(block_table.shape)}",
    )  # fmt: skip
    _check_decode(
        cache_seqlens.shape == (b,) and cache_seqlens.dtype == torch.int32,
        "cache_seqlens", f"int32 [b = {b}]", f"{cache_seqlens.dtype} {list(cache_seqlens.shape)}",
    )  # fmt: skip
    # Positions every request may attend: up to the longest length (a host read), or, while compiling (no host
    # reads), every slot of the block table.
    if torch.compiler.is_compiling() or b == 0:
        span = block_table.shape[1] * page
    else:
        span = min(int(cache_seqlens.max()), block_table.shape[1] * page)
    lengths = cache_seqlens.long().clamp(0, block_table.shape[1] * page)
    pos = torch.arange(span, device=q.device)
    valid = pos[None, :] < lengths[:, None]  # [b, span]
    physical = block_table.long().gather(1, (pos // page).expand(b, span).clamp(max=max(block_table.shape[1] - 1, 0)))
    records = torch.where(valid, physical * page + pos % page, -1)
    records = torch.where(records < blocks * page, records, -1).to(torch.int32)  # a bad table entry reads nothing
    indices = records[:, None, None, :].expand(b, s_q, 1, span).reshape(b * s_q, 1, span)
    limit = None
    if causal and s_q > 1:  # query r of s_q sees position c iff c <= length - s_q + r
        rows = torch.arange(s_q, device=q.device)
        limit = (lengths[:, None] - s_q + rows[None, :] + 1).clamp(min=0).to(torch.int32).reshape(b * s_q)
    group = h_q // h_kv
    outs, lses = [], []
    for g in range(h_kv):
        kv = k_cache[:, :, g : g + 1, :].flatten(0, 1)  # [blocks * page, 1, d]: a view for a contiguous cache
        q_g = q[:, :, g * group : (g + 1) * group, :].reshape(b * s_q, group, d)
        out, _, lse = sparse_mla_prefill(q_g, kv, indices, softmax_scale, head_dim_v, None, limit)
        outs.append(out.view(b, s_q, group, head_dim_v))
        lses.append(lse.view(b, s_q, group))
    out = torch.cat(outs, dim=2) if h_kv > 1 else outs[0]
    lse = torch.cat(lses, dim=2) if h_kv > 1 else lses[0]
    # [b, h_q, s_q] with standard strides (contiguous() would keep a transposed view's strides when s_q is 1)
    return out, lse.new_empty(b, h_q, s_q).copy_(lse.transpose(1, 2))
