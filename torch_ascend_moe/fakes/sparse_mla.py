"""Fakes of the sparse_mla family (FlashMLA's sparse attention); the checks and the caches' record formats are
``torch_ascend_moe/checks/sparse_mla.py``.

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

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.sparse_mla import sparse_mla_decode_signature, sparse_mla_prefill_signature


@fake
def sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    acc = sparse_mla_prefill_signature(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    s_q, h_q = q.shape[0], q.shape[1]
    return q.new_empty([s_q, h_q, d_v]), q.new_empty([s_q, h_q], dtype=acc), q.new_empty([s_q, h_q], dtype=acc)


@fake
def sparse_mla_decode(
    q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
):
    acc = sparse_mla_decode_signature(
        q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
    )
    b, s_q, h_q, _ = q.shape
    return q.new_empty([b, s_q, h_q, d_v]), q.new_empty([b, h_q, s_q], dtype=acc)
