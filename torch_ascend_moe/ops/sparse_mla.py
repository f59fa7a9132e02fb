"""The sparse_mla family: FlashMLA's sparse attention, the consumer of DeepSeek Sparse Attention's indexer top-k."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_prefill = torch.ops.ascend_moe.sparse_mla_prefill.default
_decode = torch.ops.ascend_moe.sparse_mla_decode.default


@schema_defaults
def sparse_mla_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = FROM_SCHEMA,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, max_logits, lse)``: each query token attends over its own ``topk`` KV rows (FlashMLA's
    ``flash_mla_sparse_fwd``).

    ``q [s_q, h_q, d_qk]``, ``kv [s_kv, 1, d_qk]`` (one latent KV head; V is its first ``d_v`` columns), ``indices
    [s_q, 1, topk]`` int32: an index ``< 0`` or ``>= s_kv`` is left out, as is every position ``>= topk_length[i]``
    (``[s_q]`` int32). ``P = sm_scale * q.k``; ``lse = ln sum exp P`` and ``max_logits = max P`` (FP32 ``[s_q, h_q]``);
    ``out = sum softmax(P) V``, scaled by ``exp(lse) / (exp(lse) + exp(attn_sink[h]))`` with a sink (``[h_q]``
    FP32). A token with no row: ``out`` 0, ``lse`` +inf, ``max_logits`` -inf. Memory O(s_q * topk); differentiable
    in ``q``, ``kv`` (through the selected rows) and ``attn_sink``.

    >>> q, kv = torch.randn(3, 2, 8), torch.randn(10, 1, 8)
    >>> idx = torch.tensor([[[0, 4, -1]], [[9, 9, 1]], [[-1, 10, -5]]], dtype=torch.int32)
    >>> out, max_logits, lse = sparse_mla_prefill(q, kv, idx, 0.5, d_v=4)
    >>> out.shape, lse[2].tolist()
    (torch.Size([3, 2, 4]), [inf, inf])
    """
    return _prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)


@schema_defaults
def sparse_mla_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = FROM_SCHEMA,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(out [b, s_q, h_q, d_v], lse [b, h_q, s_q])``: FlashMLA's sparse decode over paged FP8/FP4 KV caches
    ``[num_blocks, page_block_size, 1, bytes_per_token]`` (uint8), the record format told by its size: DeepSeek-V3.2's
    656 bytes (512 E4M3 values, 4 FP32 scales per 128, 64 BF16 RoPE values; ``q [b, s_q, h_q, 576]``), V4's 584
    (block-major: 448 E4M3 + 64 BF16 RoPE values per row, 7 UE8M0 scales per 64 after the block's rows), V4.1's 528
    (512 E4M3 values, 16 UE8M0 scales per 32) and 288 (512 E2M1 values, 32 E4M3 scales per 16), the last three
    with ``q [..., 512]``. ``indices [b, s_q, topk]`` int32 are record numbers ``block * page_block_size + offset``
    (``< 0`` or past the cache left out, as are positions ``>= topk_length[b]``); with ``extra_k_cache`` the
    records ``extra_indices [b, s_q, extra_topk]`` (and ``extra_topk_length``) join the same softmax. Each record
    is dequantized to BF16 as the kernels do; then ``sparse_mla_prefill``'s attention (sinks, lonely tokens: out
    0, lse +inf). Differentiable in ``q`` and ``attn_sink``.
    """
    return _decode(
        q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache, extra_indices, extra_topk_length
    )
