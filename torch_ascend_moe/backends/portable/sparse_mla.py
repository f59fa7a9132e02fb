"""Device-generic sparse_mla kernels with torch ops, in chunks of query tokens so that memory stays
O(chunk * topk * (d_qk + h_q)): each chunk gathers its selected KV rows, never a ``[s_q, s_kv]`` matrix.

Numerics (the op's definition, which every kernel follows): logits ``sm_scale * q.k`` from q and KV in FP32
(FP64 for FP64 inputs), the softmax weights ``exp(logit - L)`` in FP32 (not rounded to BF16 as FlashMLA's
tensor-core PV product does: closer to the exact value), the weighted sum of V in FP32, one rounding to q's dtype.
Rows that are left out contribute nothing, even when they hold NaN.
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.meta.sparse_mla import (
    V32_BLOCK,
    V32_BYTES,
    V32_NOPE,
    V41_BLOCK,
    V41_DIM,
    sparse_mla_decode_signature,
    sparse_mla_prefill_signature,
)

CHUNK_ELEMENTS = 1 << 24  # gathered rows + logits per chunk of queries (64 MiB in FP32)


def query_chunks(s_q: int, topk: int, d_qk: int, h_q: int):
    """``(start, end)`` of each chunk of query tokens."""
    rows = max(1, CHUNK_ELEMENTS // max(1, topk * (d_qk + h_q)))
    return [(i, min(i + rows, s_q)) for i in range(0, s_q, rows)]


def selected(kv, indices, topk_length, start, end, acc):
    """For query tokens ``[start, end)``: ``valid [c, topk]`` and the selected KV rows ``[c, topk, d_qk]`` in
    ``acc`` (rows left out are zeros, whatever the row they would point at holds)."""
    idx = indices[start:end, 0, :].long()
    valid = (idx >= 0) & (idx < kv.shape[0])
    if topk_length is not None:
        positions = torch.arange(idx.shape[1], device=idx.device)
        valid &= positions < topk_length[start:end, None].long()
    rows = kv[:, 0, :][torch.where(valid, idx, 0)]
    rows.masked_fill_(~valid[..., None], 0)  # in place, in kv's dtype: the cheapest pass over the gathered rows
    return valid, rows.to(acc)


def softmax_parts(q_c, rows, valid, sm_scale, attn_sink):
    """``(logits [c, h, topk] with -inf where left out, lse without the sink, the normaliser L with it)``."""
    logits = torch.einsum("chd,ctd->cht", q_c, rows) * sm_scale
    logits = logits.masked_fill(~valid[:, None, :], -math.inf)
    lse = torch.logsumexp(logits, dim=-1)
    norm = lse if attn_sink is None else torch.logaddexp(lse, attn_sink.to(lse.dtype)[None, :])
    return logits, lse, norm


def weights(logits, norm):
    """``exp(logit - L)``, 0 where the row is left out (also for a query with no row, where L is -inf)."""
    return torch.where(logits == -math.inf, 0, torch.exp(logits - norm[..., None]))


@portable_kernel
def sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    acc = sparse_mla_prefill_signature(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    s_q, h_q, d_qk = q.shape
    out = q.new_empty(s_q, h_q, d_v)
    max_logits = q.new_empty(s_q, h_q, dtype=acc)
    lse = q.new_empty(s_q, h_q, dtype=acc)
    for start, end in query_chunks(s_q, indices.shape[2], d_qk, h_q):
        valid, rows = selected(kv, indices, topk_length, start, end, acc)
        logits, lse_c, norm = softmax_parts(q[start:end].to(acc), rows, valid, sm_scale, attn_sink)
        p = weights(logits, norm)
        out[start:end] = torch.einsum("cht,ctd->chd", p, rows[..., :d_v]).to(q.dtype)
        lonely = ~valid.any(dim=-1)[:, None]  # no row at all: lse +inf, max_logits -inf (FlashMLA's kernel)
        max_logits[start:end] = torch.where(lonely, -math.inf, logits.amax(dim=-1) if logits.shape[-1] else 0)
        lse[start:end] = torch.where(lonely, math.inf, lse_c)
    return out, max_logits, lse


def v32_records(k_cache: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """The 656-byte records ``flat`` (``block * page_block_size + offset``, in range) of a V3.2 cache, dequantized
    as FlashMLA's kernels do: ``bf16(e4m3) * bf16(scale)`` rounded to BF16 per NoPE value, the RoPE part as stored:
    ``[n, 576]`` BF16."""
    page = k_cache.shape[1]
    records = k_cache.view(torch.uint8)[flat // page, flat % page, 0]  # [n, 656]
    nope = records[:, :V32_NOPE].view(torch.float8_e4m3fn).to(torch.bfloat16)
    scales = records[:, V32_NOPE : V32_NOPE + 16].contiguous().view(torch.float32).to(torch.bfloat16)
    rope = records[:, V32_NOPE + 16 : V32_BYTES].contiguous().view(torch.bfloat16)
    return torch.cat([nope * scales.repeat_interleave(V32_BLOCK, dim=1), rope], dim=1)


def v41_records(k_cache: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """V4.1's 528-byte records (512 E4M3 values, then 16 UE8M0 scales, one per 32; code 255 is NaN), dequantized
    as ``bf16(e4m3) * 2^(code - 127)``: ``[n, 512]`` BF16."""
    page = k_cache.shape[1]
    records = k_cache.view(torch.uint8)[flat // page, flat % page, 0]  # [n, 528]
    values = records[:, :V41_DIM].view(torch.float8_e4m3fn).to(torch.bfloat16)
    # 2^(code - 127) from its FP32 bits (integer ops: the backward's recompute runs under Inductor, which has no
    # float8_e8m0fnu type); code 0 is the subnormal 2^-127, code 255 NaN.
    codes = records[:, V41_DIM:].to(torch.int32)
    scales = torch.where(codes == 0, 2.0**-127, (codes << 23).view(torch.float32))
    scales = torch.where(codes == 255, math.nan, scales).to(torch.bfloat16)
    return values * scales.repeat_interleave(V41_BLOCK, dim=1)


def decode_composition(q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length):
    """``sparse_mla_decode`` as the prefill op over each request's dequantized records (no validation): the records
    every query token selected, in order, are its KV rows (records left out are -1, never read)."""
    b, s_q, h_q, d_qk = q.shape
    topk = indices.shape[2]
    idx = indices.long()
    valid = (idx >= 0) & (idx < k_cache.shape[0] * k_cache.shape[1])
    if topk_length is not None:
        valid &= torch.arange(topk, device=idx.device) < topk_length.long()[:, None, None]
    read = v32_records if k_cache.shape[3] == V32_BYTES else v41_records
    rows = read(k_cache, torch.where(valid, idx, 0).reshape(-1)).to(q.dtype)
    slots = torch.arange(rows.shape[0], device=idx.device).view(b, s_q, topk)
    own = torch.where(valid, slots, -1).to(torch.int32).reshape(b * s_q, 1, topk)
    out, _, lse = torch.ops.ascend_moe.sparse_mla_prefill(
        q.reshape(b * s_q, h_q, d_qk), rows[:, None, :], own, sm_scale, d_v, attn_sink, None
    )
    # [b, h_q, s_q] with standard strides (contiguous() would keep a transposed view's strides when s_q is 1)
    lse_out = lse.new_empty(b, h_q, s_q).copy_(lse.view(b, s_q, h_q).transpose(1, 2))
    return out.view(b, s_q, h_q, d_v), lse_out


@portable_kernel
def sparse_mla_decode(q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length):
    sparse_mla_decode_signature(q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length)
    return decode_composition(q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length)
