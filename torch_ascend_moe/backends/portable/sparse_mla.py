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
from torch_ascend_moe.checks.sparse_mla import (
    V4_BLOCK,
    V4_BYTES,
    V4_NOPE,
    V4_ROW,
    V4_SCALES,
    V32_BLOCK,
    V32_BYTES,
    V32_NOPE,
    V41_BLOCK,
    V41_BYTES,
    V41_DIM,
    V41_FP4_BLOCK,
    V41_FP4_BYTES,
    sparse_mla_decode_signature,
    sparse_mla_prefill_signature,
)
from torch_ascend_moe.quant.encodings import FP8_MAX

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


def _token_records(k_cache: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """The bytes of records ``flat`` (``block * page_block_size + offset``, in range) of a token-major cache."""
    page = k_cache.shape[1]
    return k_cache.view(torch.uint8)[flat // page, flat % page, 0]


def _ue8m0(codes: torch.Tensor) -> torch.Tensor:
    """UE8M0 codes (uint8) as ``2^(code - 127)`` in BF16 (exact), from their FP32 bits: integer ops, because the
    backward's recompute runs under Inductor, which has no float8_e8m0fnu type. Code 0 is the subnormal 2^-127,
    255 NaN."""
    codes = codes.to(torch.int32)
    scales = torch.where(codes == 0, 2.0**-127, (codes << 23).view(torch.float32))
    return torch.where(codes == 255, math.nan, scales).to(torch.bfloat16)


def v32_records(k_cache: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3.2's 656-byte records dequantized as FlashMLA's kernels do: ``bf16(e4m3) * bf16(scale)`` rounded
    to BF16 per NoPE value, the RoPE part as stored: ``[n, 576]`` BF16."""
    records = _token_records(k_cache, flat)  # [n, 656]
    nope = records[:, :V32_NOPE].view(torch.float8_e4m3fn).to(torch.bfloat16)
    scales = records[:, V32_NOPE : V32_NOPE + 16].contiguous().view(torch.float32).to(torch.bfloat16)
    rope = records[:, V32_NOPE + 16 : V32_BYTES].contiguous().view(torch.bfloat16)
    return torch.cat([nope * scales.repeat_interleave(V32_BLOCK, dim=1), rope], dim=1)


def encode_v32(values: torch.Tensor) -> torch.Tensor:
    """The inverse of ``v32_records``: latent rows ``[n, 576]`` as 656-byte records ``[n, 656]`` uint8, quantized as
    FlashMLA's own tests do (per tile of 128 NoPE values the scale ``2^ceil(log2(max(amax / 448, 1e-4)))``, codes
    ``value / scale`` in E4M3; the RoPE part as BF16): what a model writes into the cache."""
    n = values.shape[0]
    tiles = values[:, :V32_NOPE].float().view(n, V32_NOPE // V32_BLOCK, V32_BLOCK)
    scales = torch.exp2(torch.ceil(torch.log2((tiles.abs().amax(dim=-1) / FP8_MAX).clamp(min=1e-4))))
    codes = (tiles / scales[..., None]).to(torch.float8_e4m3fn).view(torch.uint8).view(n, V32_NOPE)
    rope = values[:, V32_NOPE:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat([codes, scales.contiguous().view(torch.uint8), rope], dim=1)


def v4_records(k_cache: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V4's 584-byte records, block-major (a block's 576-byte data rows, then its 8-byte scale rows):
    ``bf16(e4m3) * bf16(2^(code - 127))`` per 64 NoPE values, the BF16 RoPE part as stored: ``[n, 512]`` BF16."""
    blocks, page = k_cache.shape[:2]
    runs = k_cache.view(torch.uint8).flatten(1)  # [blocks, page * 584]: one run per block (stride(1) == 584)
    block, offset = flat // page, flat % page
    rows = runs[:, : page * V4_ROW].view(blocks, page, V4_ROW)[block, offset]  # [n, 576]
    codes = runs[:, page * V4_ROW : page * V4_BYTES].view(blocks, page, V4_SCALES)[block, offset, : V4_NOPE // V4_BLOCK]
    nope = rows[:, :V4_NOPE].view(torch.float8_e4m3fn).to(torch.bfloat16)
    rope = rows[:, V4_NOPE:].contiguous().view(torch.bfloat16)
    return torch.cat([nope * _ue8m0(codes).repeat_interleave(V4_BLOCK, dim=1), rope], dim=1)


def v41_records(k_cache: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """V4.1's 528-byte records (512 E4M3 values, then 16 UE8M0 scales, one per 32), dequantized as ``bf16(e4m3) *
    2^(code - 127)``: ``[n, 512]`` BF16."""
    records = _token_records(k_cache, flat)  # [n, 528]
    values = records[:, :V41_DIM].view(torch.float8_e4m3fn).to(torch.bfloat16)
    return values * _ue8m0(records[:, V41_DIM:]).repeat_interleave(V41_BLOCK, dim=1)


def v41_fp4_records(k_cache: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """V4.1's 288-byte FP4 records (512 E2M1 values, two per byte with the even one in the low nibble, then 32 E4M3
    scales, one per 16), dequantized as ``bf16(e2m1) * bf16(e4m3)`` (exact: 2 x 4 significant bits): ``[n, 512]``."""
    records = _token_records(k_cache, flat)  # [n, 288]
    packed = records[:, : V41_DIM // 2].to(torch.int32)
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(1)  # [n, 512]
    exponent, mantissa = (codes >> 1) & 3, (codes & 1).to(torch.float32)
    magnitude = torch.where(exponent == 0, 0.5 * mantissa, torch.exp2(exponent - 1.0) * (1 + 0.5 * mantissa))
    values = torch.where(codes >= 8, -magnitude, magnitude).to(torch.bfloat16)
    scales = records[:, V41_DIM // 2 :].view(torch.float8_e4m3fn).to(torch.bfloat16)
    return values * scales.repeat_interleave(V41_FP4_BLOCK, dim=1)


RECORDS = {V32_BYTES: v32_records, V4_BYTES: v4_records, V41_BYTES: v41_records, V41_FP4_BYTES: v41_fp4_records}


def _scope(q, cache, indices, topk_length):
    """One KV scope of requests ``q``'s: ``(valid [b, s_q, topk], its records [b * s_q * topk, d_qk])`` in q's
    dtype (a record left out is read as record 0 and never used)."""
    idx = indices.long()
    valid = (idx >= 0) & (idx < cache.shape[0] * cache.shape[1])
    if topk_length is not None:
        valid &= torch.arange(idx.shape[2], device=idx.device) < topk_length.long()[:, None, None]
    records = cache.shape[0] * cache.shape[1]
    if isinstance(records, int) and records == 0:  # an empty cache: nothing valid, no record 0 to stand in
        return valid, q.new_zeros(idx.numel(), q.shape[-1])  # (sizes 0 and 1 are static under compile)
    return valid, RECORDS[cache.shape[3]](cache, torch.where(valid, idx, 0).reshape(-1)).to(q.dtype)


def _decode_requests(q, scopes, sm_scale, d_v, attn_sink):
    """The prefill op over requests ``q [b, s_q, h_q, d_qk]``: each query token's KV rows are its scopes' records,
    in order, in one softmax."""
    b, s_q, h_q, d_qk = q.shape
    rows, own, base = [], [], 0
    for valid, records in scopes:
        slots = base + torch.arange(records.shape[0], device=valid.device).view(valid.shape)
        rows.append(records)
        own.append(torch.where(valid, slots, -1))
        base += records.shape[0]
    own = torch.cat(own, dim=2).to(torch.int32)
    own = own.reshape(b * s_q, 1, own.shape[2])  # not -1: an empty batch has no size to infer
    out, _, lse = torch.ops.ascend_moe.sparse_mla_prefill(
        q.reshape(b * s_q, h_q, d_qk), torch.cat(rows)[:, None, :], own, sm_scale, d_v, attn_sink, None
    )
    return out.view(b, s_q, h_q, d_v), lse.view(b, s_q, h_q)


def _rows_of(t: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
    return None if t is None else t[rows]


def decode_composition(
    q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
):
    """``sparse_mla_decode`` as the prefill op over the dequantized records each query token selected (no
    validation), a chunk of requests at a time so the records in memory stay O(chunk): the main scope's records,
    then the extra scope's, in one softmax (records left out are -1, never read)."""
    b, s_q, h_q, d_qk = q.shape
    per_request = s_q * (indices.shape[2] + (0 if extra_indices is None else extra_indices.shape[2])) * d_qk
    step = max(1, CHUNK_ELEMENTS // max(1, per_request)) if isinstance(b, int) else b  # symbolic b: one chunk
    outs, lses = [], []
    for r in range(0, b, step) if b else [0]:
        rs = slice(r, r + step)
        scopes = [_scope(q[rs], k_cache, indices[rs], _rows_of(topk_length, rs))]
        if extra_k_cache is not None:
            scopes.append(_scope(q[rs], extra_k_cache, extra_indices[rs], _rows_of(extra_topk_length, rs)))
        out, lse = _decode_requests(q[rs], scopes, sm_scale, d_v, attn_sink)
        outs.append(out)
        lses.append(lse)
    out, lse = torch.cat(outs), torch.cat(lses)
    # [b, h_q, s_q] with standard strides (contiguous() would keep a transposed view's strides when s_q is 1)
    return out, lse.new_empty(b, h_q, s_q).copy_(lse.transpose(1, 2))


@portable_kernel
def sparse_mla_decode(
    q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
):
    args = (q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length)
    sparse_mla_decode_signature(*args)
    return decode_composition(*args)
