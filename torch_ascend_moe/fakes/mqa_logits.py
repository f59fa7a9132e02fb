"""Fakes of the mqa_logits family; the checks are ``torch_ascend_moe/checks/mqa_logits.py``."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.mqa_logits import (
    OP,
    acc_dtype,
    backward_signature,
    fused_signature,
    metadata_signature,
    mqa_signature,
    paged_signature,
    paged_sparse_signature,
    sparse_signature,
    topk_signature,
)


@fake
def mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype):
    sh = mqa_signature(OP, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype)
    return q.new_empty([sh.S, max_seqlen_k if max_seqlen_k > 0 else sh.S_kv], dtype=sh.out_dtype)


@fake
def mqa_logits_backward(grad, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, output_mask):
    sh = backward_signature(grad, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k)
    acc = acc_dtype(q)
    shapes = ([sh.S, sh.H, sh.D], [sh.S_kv, sh.D], [sh.S, sh.H])
    return tuple(q.new_empty(s if need else [0], dtype=acc) for s, need in zip(shapes, output_mask))


@fake
def paged_mqa_logits(
    q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
):
    _, _, out = paged_signature(
        q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
    )
    return q.new_empty([q.shape[0] * q.shape[1], max_context_len], dtype=out)


@fake
def paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices):
    metadata_signature(context_lens, block_kv, num_sms, indices)
    return context_lens.new_empty([num_sms + 1, 2])


@fake
def mqa_topk(logits, ks, ke, topk, compressed):
    topk_signature(logits, ks, ke, topk)
    return logits.new_empty([logits.shape[0], topk]), logits.new_empty([logits.shape[0], topk], dtype=torch.int32)


@fake
def mqa_logits_topk(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype):
    sh = fused_signature(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype)
    return q.new_empty([sh.S, topk], dtype=sh.out_dtype), q.new_empty([sh.S, topk], dtype=torch.int32)


@fake
def sparse_mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, unaligned_ks, logits_dtype):
    sh, nb = sparse_signature(q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, logits_dtype)
    return q.new_empty([sh.S, nb * sparse_block_kv], dtype=sh.out_dtype)


@fake
def paged_sparse_mqa_logits(
    q,
    q_sf,
    kv_cache,
    weights,
    context_lens,
    block_table,
    block_indices,
    sparse_block_kv,
    ascend_kv_layout,
    logits_dtype,
):
    _, _, out, nb = paged_sparse_signature(
        q,
        q_sf,
        kv_cache,
        weights,
        context_lens,
        block_table,
        block_indices,
        sparse_block_kv,
        ascend_kv_layout,
        logits_dtype,
    )
    return q.new_empty([q.shape[0] * q.shape[1], nb * sparse_block_kv], dtype=out)
