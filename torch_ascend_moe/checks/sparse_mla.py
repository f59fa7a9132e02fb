"""The sparse_mla family's argument checks (``sparse_mla_prefill``, ``sparse_mla_decode``) and the paged caches'
record formats they read. Twin: ``csrc/ops/sparse_mla_checks.h`` (the same checks in the same order, the same
words; tests/test_validation_twins.py compares them). ``sparse_mla_decode`` has no C++ kernel: its own checks are
Python's alone (``PYTHON_ONLY``)."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

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
RECORDS_TEXT = "656 (DeepSeek-V3.2's FP8 record), 584 (V4's), 528 (V4.1's FP8) or 288 (V4.1's FP4)"
CACHE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)
DTYPES_TEXT = "one of torch.bfloat16, torch.float16, torch.float32, torch.float64"
DECODE_DTYPES = (torch.bfloat16, torch.float32, torch.float64)  # the cache dequantizes to BF16: exact in these
DECODE_DTYPES_TEXT = "one of torch.bfloat16, torch.float32, torch.float64"
# Check functions of ops that no C++ kernel implements (function -> its ops): they have no C++ twin.
PYTHON_ONLY = {"sparse_mla_decode_signature": (DECODE,), "check_cache": (DECODE,), "check_indices": (DECODE,)}


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """Where the logits, the softmax and the weighted sum are computed (and lse / max_logits are returned)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def check_same_device_as_q(op: str, arg: str, t: torch.Tensor, q: torch.Tensor) -> None:
    ck.check_arg(t.device == q.device, op, arg, "device", lambda: f"{q.device} (same as 'q')", t.device)


def sparse_mla_prefill_signature(q, kv, indices, sm_scale, d_v, attn_sink, topk_length) -> torch.dtype:
    """Checks a call; returns the accumulation dtype."""
    op = PREFILL
    ck.check_rank(op, "q", q, 3, "[s_q, h_q, d_qk]")
    ck.check_arg(q.dtype in DTYPES, op, "q", "dtype", DTYPES_TEXT, q.dtype)
    ck.check_rank(op, "kv", kv, 3, "[s_kv, h_kv, d_qk]")
    ck.check_arg(kv.dtype == q.dtype, op, "kv", "dtype", lambda: f"{q.dtype} (same as 'q')", kv.dtype)
    check_same_device_as_q(op, "kv", kv, q)
    ck.check_dim_size(op, "kv", kv, 1, "h_kv", 1, "one KV head")
    ck.check_dim_size(op, "kv", kv, 2, "d_qk", q.shape[2], "q.size(2)")
    ck.check_rank(op, "indices", indices, 3, "[s_q, h_kv, topk]")
    ck.check_arg(indices.dtype == torch.int32, op, "indices", "dtype", "torch.int32", indices.dtype)
    check_same_device_as_q(op, "indices", indices, q)
    ck.check_dim_size(op, "indices", indices, 0, "s_q", q.shape[0], "q.size(0)")
    ck.check_dim_size(op, "indices", indices, 1, "h_kv", 1, "kv.size(1)")
    ck.check_int_arg(op, "d_v", d_v, 1)
    ck.check_arg(d_v <= q.shape[2], op, "d_v", "value", lambda: f"at most d_qk = {ck._text(q.shape[2])}", d_v)
    acc = accumulator(q.dtype)
    check_sink_and_lengths(op, q, acc, attn_sink, 1, topk_length, "s_q", "[s_q]")
    return acc


def check_sink_and_lengths(op, q, acc, attn_sink, heads_dim: int, topk_length, per: str, layout: str) -> None:
    """``attn_sink [h_q]`` (q's dim ``heads_dim``) in the accumulation dtype; ``topk_length`` int32, one per ``per``
    (q's dim 0)."""
    if attn_sink is not None:
        ck.check_rank(op, "attn_sink", attn_sink, 1, "[h_q]")
        ck.check_arg(attn_sink.dtype == acc, op, "attn_sink", "dtype", str(acc), attn_sink.dtype)
        check_same_device_as_q(op, "attn_sink", attn_sink, q)
        ck.check_dim_size(op, "attn_sink", attn_sink, 0, "h_q", q.shape[heads_dim], f"q.size({heads_dim})")
    if topk_length is not None:
        check_lengths(op, "topk_length", topk_length, q, per, layout)


def check_lengths(op: str, arg: str, lengths: torch.Tensor, q: torch.Tensor, per: str, layout: str) -> None:
    """int32, one per ``per`` (q's dim 0)."""
    ck.check_rank(op, arg, lengths, 1, layout)
    ck.check_arg(lengths.dtype == torch.int32, op, arg, "dtype", "torch.int32", lengths.dtype)
    check_same_device_as_q(op, arg, lengths, q)
    ck.check_dim_size(op, arg, lengths, 0, per, q.shape[0], "q.size(0)")


def check_cache(op: str, arg: str, cache: torch.Tensor, q: torch.Tensor) -> int:
    """A paged cache ``[num_blocks, page_block_size, 1, bytes_per_token]`` of a record format whose d_qk is q's;
    returns the record size."""
    ck.check_rank(op, arg, cache, 4, "[num_blocks, page_block_size, 1, bytes_per_token]")
    ck.check_arg(
        cache.dtype in CACHE_DTYPES, op, arg, "dtype", "torch.uint8, torch.int8 or torch.float8_e4m3fn", cache.dtype
    )
    check_same_device_as_q(op, arg, cache, q)
    ck.check_dim_size(op, arg, cache, 2, "h_kv", 1, "one KV head")
    size = int(cache.shape[3])  # the record format: a constant of the cache, specialized under dynamic shapes
    ck.check_arg(size in RECORD_DIMS, op, arg, "size(3) (bytes_per_token)", RECORDS_TEXT, size)
    ck.check_arg(cache.stride(3) == 1, op, arg, "stride(3)", 1, lambda: cache.stride(3))
    if size == V4_BYTES:  # block-major: a block's bytes are one run (row k of the view is not token k)
        ck.check_arg(cache.stride(1) == V4_BYTES, op, arg, "stride(1)", V4_BYTES, lambda: cache.stride(1))
    ck.check_dim_size(op, "q", q, 3, "d_qk", RECORD_DIMS[size], f"the {size}-byte record's")
    return size


def check_indices(op: str, arg: str, indices: torch.Tensor, q: torch.Tensor) -> None:
    ck.check_rank(op, arg, indices, 3, "[b, s_q, topk]")
    ck.check_arg(indices.dtype == torch.int32, op, arg, "dtype", "torch.int32", indices.dtype)
    check_same_device_as_q(op, arg, indices, q)
    ck.check_dim_size(op, arg, indices, 0, "b", q.shape[0], "q.size(0)")
    ck.check_dim_size(op, arg, indices, 1, "s_q", q.shape[1], "q.size(1)")


def sparse_mla_decode_signature(
    q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
) -> torch.dtype:
    """Checks a call; returns the accumulation dtype."""
    op = DECODE
    ck.check_rank(op, "q", q, 4, "[b, s_q, h_q, d_qk]")
    ck.check_arg(q.dtype in DECODE_DTYPES, op, "q", "dtype", DECODE_DTYPES_TEXT, q.dtype)
    check_cache(op, "k_cache", k_cache, q)
    check_indices(op, "indices", indices, q)
    ck.check_int_arg(op, "d_v", d_v, 1)
    ck.check_arg(d_v <= 512, op, "d_v", "value", "at most 512 (V is the record's first 512 values)", d_v)
    acc = accumulator(q.dtype)
    check_sink_and_lengths(op, q, acc, attn_sink, 2, topk_length, "b", "[b] (one per request)")
    if extra_k_cache is None:
        for arg, t in (("extra_indices", extra_indices), ("extra_topk_length", extra_topk_length)):
            ck.check_arg(t is None, op, arg, "value", "None (no extra_k_cache)", "a tensor")
        return acc
    check_cache(op, "extra_k_cache", extra_k_cache, q)
    ck.check_arg(extra_indices is not None, op, "extra_indices", "value", "a tensor (extra_k_cache given)", None)
    check_indices(op, "extra_indices", extra_indices, q)
    if extra_topk_length is not None:
        check_lengths(op, "extra_topk_length", extra_topk_length, q, "b", "[b] (one per request)")
    return acc
