"""Fake of the sparse_mla family (FlashMLA's sparse attention) and the validation its kernels share.

``sparse_mla_decode`` is ``flash_mla_with_kvcache``'s sparse mode over paged FP8/FP4 caches (§4.4-§5): the same
attention for each request's query tokens over the cache records ``indices[b, s, :]`` (``block * page_block_size
+ offset``; ``< 0`` or past the cache left out, as are positions ``>= topk_length[b]``), and with an extra cache
over its records ``extra_indices[b, s, :]`` too, in one softmax (DeepSeek-V4's two KV scopes). Each record is
dequantized as the kernels do (``bf16(code) * bf16(scale)``, rounded to BF16; unquantized RoPE parts as stored);
``lse [b, h_q, s_q]``. A cache's record format is told by its size: DeepSeek-V3.2's 656 bytes (d_qk 576),
V4's 584 (block-major), V4.1's 528 (FP8) and 288 (FP4), both token-interleaved (the Ascend release's form).

``sparse_mla_prefill`` is ``flash_mla_sparse_fwd`` (specs/flashmla_api.md §3, the current G2/G3 definitions):
query token ``i``, head ``h`` attends over the ``topk`` KV rows ``indices[i, 0, :]`` (one KV head, its first
``d_v`` columns are V); an index ``< 0`` or ``>= s_kv``, or a position ``>= topk_length[i]``, is left out.
Outputs ``out [s_q, h_q, d_v]`` (q's dtype), ``max_logits`` and the natural-log ``lse`` ``[s_q, h_q]`` (FP32;
FP64 for FP64 inputs).
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe._registry import fake

PREFILL = "ascend_moe::sparse_mla_prefill"
DECODE = "ascend_moe::sparse_mla_decode"
# DeepSeek-V3.2's token record in the paged FP8 cache (specs/flashmla_api.md §5.1): 512 E4M3 NoPE values, 4 FP32
# scales (one per 128 values), 64 BF16 RoPE values.
V32_BYTES, V32_NOPE, V32_ROPE, V32_BLOCK = 656, 512, 64, 128
# DeepSeek-V4's record (§5.2, "MODEL1"), block-major: a block of B tokens holds B rows of 448 E4M3 NoPE values and
# 64 BF16 RoPE values (576 bytes each), then B rows of 7 UE8M0 scales (one per 64 values) and a pad byte.
V4_BYTES, V4_ROW, V4_NOPE, V4_BLOCK, V4_SCALES = 584, 576, 448, 64, 8
# DeepSeek-V4.1's FP8 record (§5.3, the G3 / Ascend release's token-interleaved form): 512 E4M3 values (RoPE part
# quantized too) then 16 UE8M0 scales, one per 32 values.
V41_BYTES, V41_DIM, V41_BLOCK = 528, 512, 32
# V4.1's FP4 record (§5.3, token-interleaved): 512 E2M1 values packed two per byte (even index in the low nibble)
# then 32 E4M3 scales, one per 16 values.
V41_FP4_BYTES, V41_FP4_BLOCK = 288, 16
RECORD_DIMS = {V32_BYTES: V32_NOPE + V32_ROPE, V4_BYTES: 512, V41_BYTES: V41_DIM, V41_FP4_BYTES: V41_DIM}
_RECORDS_TEXT = "656 (DeepSeek-V3.2's FP8 record), 584 (V4's), 528 (V4.1's FP8) or 288 (V4.1's FP4)"
CACHE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
_DTYPES_TEXT = "one of torch.bfloat16, torch.float16, torch.float32, torch.float64"
DECODE_DTYPES = (torch.bfloat16, torch.float32, torch.float64)  # the cache dequantizes to BF16: exact in these
_DECODE_DTYPES_TEXT = "one of torch.bfloat16, torch.float32, torch.float64"


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """Where the logits, the softmax and the weighted sum are computed (and lse / max_logits are returned)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _same_device(op: str, arg: str, t: torch.Tensor, q: torch.Tensor) -> None:
    ck.check_arg(t.device == q.device, op, arg, "device", lambda: f"{q.device} (same as 'q')", t.device)


def sparse_mla_prefill_signature(q, kv, indices, sm_scale, d_v, attn_sink, topk_length) -> torch.dtype:
    """Checks a call; returns the accumulation dtype."""
    op = PREFILL
    ck.check_rank(op, "q", q, 3, "[s_q, h_q, d_qk]")
    ck.check_arg(q.dtype in DTYPES, op, "q", "dtype", _DTYPES_TEXT, q.dtype)
    ck.check_rank(op, "kv", kv, 3, "[s_kv, h_kv, d_qk]")
    ck.check_arg(kv.dtype == q.dtype, op, "kv", "dtype", lambda: f"{q.dtype} (same as 'q')", kv.dtype)
    _same_device(op, "kv", kv, q)
    ck.check_dim_size(op, "kv", kv, 1, "h_kv", 1, "one KV head")
    ck.check_dim_size(op, "kv", kv, 2, "d_qk", q.shape[2], "q.size(2)")
    ck.check_rank(op, "indices", indices, 3, "[s_q, h_kv, topk]")
    ck.check_arg(indices.dtype == torch.int32, op, "indices", "dtype", "torch.int32", indices.dtype)
    _same_device(op, "indices", indices, q)
    ck.check_dim_size(op, "indices", indices, 0, "s_q", q.shape[0], "q.size(0)")
    ck.check_dim_size(op, "indices", indices, 1, "h_kv", 1, "kv.size(1)")
    ck.check_int_arg(op, "d_v", d_v, 1)
    ck.check_arg(d_v <= q.shape[2], op, "d_v", "value", lambda: f"at most d_qk = {ck._text(q.shape[2])}", d_v)
    acc = accumulator(q.dtype)
    _check_sink_and_lengths(op, q, acc, attn_sink, 1, topk_length, "s_q", "[s_q]")
    return acc


def _check_sink_and_lengths(op, q, acc, attn_sink, heads_dim: int, topk_length, per: str, layout: str) -> None:
    """``attn_sink [h_q]`` (q's dim ``heads_dim``) in the accumulation dtype; ``topk_length`` int32, one per ``per``
    (q's dim 0)."""
    if attn_sink is not None:
        ck.check_rank(op, "attn_sink", attn_sink, 1, "[h_q]")
        ck.check_arg(attn_sink.dtype == acc, op, "attn_sink", "dtype", str(acc), attn_sink.dtype)
        _same_device(op, "attn_sink", attn_sink, q)
        ck.check_dim_size(op, "attn_sink", attn_sink, 0, "h_q", q.shape[heads_dim], f"q.size({heads_dim})")
    if topk_length is not None:
        _check_lengths(op, "topk_length", topk_length, q, per, layout)


def _check_lengths(op: str, arg: str, lengths: torch.Tensor, q: torch.Tensor, per: str, layout: str) -> None:
    """int32, one per ``per`` (q's dim 0)."""
    ck.check_rank(op, arg, lengths, 1, layout)
    ck.check_arg(lengths.dtype == torch.int32, op, arg, "dtype", "torch.int32", lengths.dtype)
    _same_device(op, arg, lengths, q)
    ck.check_dim_size(op, arg, lengths, 0, per, q.shape[0], "q.size(0)")


@fake
def sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    acc = sparse_mla_prefill_signature(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    s_q, h_q = q.shape[0], q.shape[1]
    return q.new_empty([s_q, h_q, d_v]), q.new_empty([s_q, h_q], dtype=acc), q.new_empty([s_q, h_q], dtype=acc)


def _check_cache(op: str, arg: str, cache: torch.Tensor, q: torch.Tensor) -> int:
    """A paged cache ``[num_blocks, page_block_size, 1, bytes_per_token]`` of a record format whose d_qk is q's;
    returns the record size."""
    ck.check_rank(op, arg, cache, 4, "[num_blocks, page_block_size, 1, bytes_per_token]")
    ck.check_arg(
        cache.dtype in CACHE_DTYPES, op, arg, "dtype", "torch.uint8, torch.int8 or torch.float8_e4m3fn", cache.dtype
    )
    _same_device(op, arg, cache, q)
    ck.check_dim_size(op, arg, cache, 2, "h_kv", 1, "one KV head")
    size = int(cache.shape[3])  # the record format: a constant of the cache, specialized under dynamic shapes
    ck.check_arg(size in RECORD_DIMS, op, arg, "size(3) (bytes_per_token)", _RECORDS_TEXT, size)
    ck.check_arg(cache.stride(3) == 1, op, arg, "stride(3)", 1, lambda: cache.stride(3))
    if size == V4_BYTES:  # block-major: a block's bytes are one run (row k of the view is not token k)
        ck.check_arg(cache.stride(1) == V4_BYTES, op, arg, "stride(1)", V4_BYTES, lambda: cache.stride(1))
    ck.check_dim_size(op, "q", q, 3, "d_qk", RECORD_DIMS[size], f"the {size}-byte record's")
    return size


def _check_indices(op: str, arg: str, indices: torch.Tensor, q: torch.Tensor) -> None:
    ck.check_rank(op, arg, indices, 3, "[b, s_q, topk]")
    ck.check_arg(indices.dtype == torch.int32, op, arg, "dtype", "torch.int32", indices.dtype)
    _same_device(op, arg, indices, q)
    ck.check_dim_size(op, arg, indices, 0, "b", q.shape[0], "q.size(0)")
    ck.check_dim_size(op, arg, indices, 1, "s_q", q.shape[1], "q.size(1)")


def sparse_mla_decode_signature(
    q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
) -> torch.dtype:
    """Checks a call; returns the accumulation dtype."""
    op = DECODE
    ck.check_rank(op, "q", q, 4, "[b, s_q, h_q, d_qk]")
    ck.check_arg(q.dtype in DECODE_DTYPES, op, "q", "dtype", _DECODE_DTYPES_TEXT, q.dtype)
    _check_cache(op, "k_cache", k_cache, q)
    _check_indices(op, "indices", indices, q)
    ck.check_int_arg(op, "d_v", d_v, 1)
    ck.check_arg(d_v <= 512, op, "d_v", "value", "at most 512 (V is the record's first 512 values)", d_v)
    acc = accumulator(q.dtype)
    _check_sink_and_lengths(op, q, acc, attn_sink, 2, topk_length, "b", "[b] (one per request)")
    if extra_k_cache is None:
        for arg, t in (("extra_indices", extra_indices), ("extra_topk_length", extra_topk_length)):
            ck.check_arg(t is None, op, arg, "value", "None (no extra_k_cache)", "a tensor")
        return acc
    _check_cache(op, "extra_k_cache", extra_k_cache, q)
    ck.check_arg(extra_indices is not None, op, "extra_indices", "value", "a tensor (extra_k_cache given)", None)
    _check_indices(op, "extra_indices", extra_indices, q)
    if extra_topk_length is not None:
        _check_lengths(op, "extra_topk_length", extra_topk_length, q, "b", "[b] (one per request)")
    return acc


@fake
def sparse_mla_decode(
    q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
):
    acc = sparse_mla_decode_signature(
        q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
    )
    b, s_q, h_q, _ = q.shape
    return q.new_empty([b, s_q, h_q, d_v]), q.new_empty([b, h_q, s_q], dtype=acc)
