"""Backward of the mqa_logits family.

``mqa_logits``: with ``P[i, h, j] = g[i, j] * w[i, h] * [s[i, h, j] > 0]`` over the valid ``[ks, ke)``
columns (masked positions contribute nothing), ``dq = P k``, ``dk = P^T q`` and
``dw[i, h] = sum_j g[i, j] relu(s[i, h, j])``. One C++ op (``mqa_logits_backward``) recomputes the scores
block by block and never stores ``[S, H, S_kv]``. FP8/FP4 operands get no gradient (their high-precision
sources do, through a straight-through fake quantizer: ``torch_ascend_moe.quant.fake_quantize``);
``weights`` always does.

``paged_mqa_logits``: gradients w.r.t. a float ``q`` and ``weights`` (the cache is bytes), by running the
ragged backward on each request's dequantized blocks. It gathers every request's ``max_blocks`` blocks,
so its memory is ``B * max_blocks * block_kv * D`` floats: meant for tests and small decode batches.

``mqa_topk``: the values' gradient goes back to the selected logits. ``mqa_logits_backward`` and
``paged_mqa_logits_metadata`` have no differentiable outputs.

``mqa_logits_topk``: the values are logits at the selected positions, so their gradient is ``mqa_logits``'
restricted to those ``topk`` columns per query: the scores are recomputed for the selected keys only (a gather
of ``[S, topk, D]`` keys), never over ``[S, S_kv]``. Padding slots (-1) contribute nothing.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad, non_differentiable
from torch_ascend_moe.backends.portable import mqa_logits as portable
from torch_ascend_moe.checks import mqa_logits as mqa_checks

_backward_op = torch.ops.ascend_moe.mqa_logits_backward.default
LOGITS, PAGED, TOPK, FUSED = "mqa_logits", "paged_mqa_logits", "mqa_topk", "mqa_logits_topk"


def _logits_setup(ctx, inputs, output):
    args = arguments(LOGITS, inputs)
    q, q_sf, k, k_sf, weights, ks, ke = args.q, args.q_sf, args.k, args.k_sf, args.weights, args.ks, args.ke
    ctx.max_seqlen_k = args.max_seqlen_k
    ctx.q_float, ctx.k_float = not mqa_checks.is_quantized(q), not mqa_checks.is_quantized(k)
    ctx.dtypes = (q.dtype, k.dtype, weights.dtype)
    ctx.has_sf = (q_sf is not None, k_sf is not None)
    ctx.save_for_backward(q, q_sf, k, k_sf, weights, ks, ke)


def _logits_backward(ctx, grad):
    q, q_sf, k, k_sf, weights, ks, ke = ctx.saved_tensors
    mask = [
        needs_grad(ctx, LOGITS, "q") and ctx.q_float,
        needs_grad(ctx, LOGITS, "k") and ctx.k_float,
        needs_grad(ctx, LOGITS, "weights"),
    ]
    if not any(mask):
        return gradients(LOGITS)
    # Detached: the gradient op's own autograd wrapper then stays out of the way (with inputs that require
    # grad it measurably held on to the kernel's score blocks, ~S_kv x 64 KB of resident memory).
    q, k, weights = q.detach(), k.detach(), weights.detach()
    dq, dk, dw = _backward_op(grad, q, q_sf, k, k_sf, weights, ks, ke, ctx.max_seqlen_k, mask)
    q_t, k_t, w_t = ctx.dtypes
    return gradients(
        LOGITS,
        q=dq.to(q_t) if mask[0] else None,
        k=dk.to(k_t) if mask[1] else None,
        weights=dw.to(w_t) if mask[2] else None,
    )


def _paged_setup(ctx, inputs, output):
    args = arguments(PAGED, inputs)
    q = args.q
    ctx.q_float = not mqa_checks.is_quantized(q)
    ctx.dtypes = (q.dtype, args.weights.dtype)
    ctx.fmt = mqa_checks.check_cache(mqa_checks.PAGED, args.kv_cache, mqa_checks.head_dim(q), args.ascend_kv_layout, q)
    ctx.max_context_len = args.max_context_len
    ctx.save_for_backward(q, args.q_sf, args.kv_cache, args.weights, args.context_lens, args.block_table)


def _paged_backward(ctx, grad):
    q, q_sf, kv_cache, weights, context_lens, block_table = ctx.saved_tensors
    need_q, need_w = needs_grad(ctx, PAGED, "q") and ctx.q_float, needs_grad(ctx, PAGED, "weights")
    if not (need_q or need_w) or ctx.max_context_len == 0:
        return gradients(PAGED)
    acc = mqa_checks.acc_dtype(q)
    qd, kd, ks, ke = portable.paged_as_ragged(q.detach(), q_sf, kv_cache, ctx.fmt, block_table, context_lens, acc)
    dq, _, dw = _backward_op(
        grad, qd, None, kd, None, weights.detach(), ks, ke, ctx.max_context_len, [need_q, False, need_w]
    )
    q_t, w_t = ctx.dtypes
    grad_q = dq.reshape(q.shape).to(q_t) if need_q else None
    return gradients(PAGED, q=grad_q, weights=dw.to(w_t) if need_w else None)


def _topk_setup(ctx, inputs, output):
    args = arguments(TOPK, inputs)
    ctx.compressed = args.compressed
    ctx.mark_non_differentiable(output[1])
    ctx.shape = args.logits.shape
    ctx.save_for_backward(output[1], args.ks)


def _topk_backward(ctx, grad_values, grad_idx):
    idx, ks = ctx.saved_tensors
    valid = idx >= 0
    cols = idx.long() - (ks.long().unsqueeze(1) if ctx.compressed else 0)
    cols = torch.where(valid, cols, 0)
    grad = grad_values.new_zeros(ctx.shape)
    grad.scatter_add_(1, cols, torch.where(valid, grad_values, 0))
    return gradients(TOPK, logits=grad)


def _fused_setup(ctx, inputs, output):
    args = arguments(FUSED, inputs)
    ctx.q_float, ctx.k_float = not mqa_checks.is_quantized(args.q), not mqa_checks.is_quantized(args.k)
    ctx.dtypes = (args.q.dtype, args.k.dtype, args.weights.dtype)
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(args.q, args.q_sf, args.k, args.k_sf, args.weights, output[1])


def _fused_backward(ctx, grad_values, grad_idx):
    q, q_sf, k, k_sf, weights, idx = ctx.saved_tensors
    need_q = needs_grad(ctx, FUSED, "q") and ctx.q_float
    need_k = needs_grad(ctx, FUSED, "k") and ctx.k_float
    need_w = needs_grad(ctx, FUSED, "weights")
    if not (need_q or need_k or need_w) or grad_values is None:
        return gradients(FUSED)
    acc = mqa_checks.acc_dtype(q)
    qd = portable.acc_values(q.detach(), q_sf, acc)  # [S, H, D]
    kd = portable.acc_values(k.detach(), k_sf, acc)  # [S_kv, D]
    w = weights.detach().to(acc)
    valid = idx >= 0
    cols = torch.where(valid, idx, 0).long()
    g = torch.where(valid, grad_values.to(acc), 0)  # [S, topk]
    keys = kd[cols] if kd.shape[0] else kd.new_zeros(*cols.shape, kd.shape[1])  # [S, topk, D]
    scores = torch.einsum("shd,std->sht", qd, keys)
    # P[s, h, t] = g[s, t] * w[s, h] * [score > 0]; selected columns only (a where: NaN elsewhere stays out).
    p = torch.where((scores > 0) & valid.unsqueeze(1), g.unsqueeze(1) * w.unsqueeze(-1), 0)
    q_t, k_t, w_t = ctx.dtypes
    grad_q = torch.einsum("sht,std->shd", p, keys).to(q_t) if need_q else None
    grad_k = None
    if need_k:
        per_key = torch.einsum("sht,shd->std", p, qd).reshape(-1, kd.shape[1])
        grad_k = torch.zeros_like(kd).index_add_(0, cols.reshape(-1), per_key).to(k_t)
    grad_w = (
        torch.einsum("st,sht->sh", g, torch.where(valid.unsqueeze(1), scores.relu(), 0)).to(w_t) if need_w else None
    )
    return gradients(FUSED, q=grad_q, k=grad_k, weights=grad_w)


autograd(LOGITS, _logits_backward, _logits_setup)
autograd(FUSED, _fused_backward, _fused_setup)
non_differentiable("mqa_logits_backward")
autograd(PAGED, _paged_backward, _paged_setup)
non_differentiable("paged_mqa_logits_metadata")
autograd(TOPK, _topk_backward, _topk_setup)


# ---- sparse: the dense formula on each row's gathered keys (recomputed per block of rows, never [S, S_kv]) ----

SPARSE, PAGED_SPARSE = "sparse_mqa_logits", "paged_sparse_mqa_logits"


def _sparse_setup(ctx, inputs, output):
    args = arguments(SPARSE, inputs)
    ctx.q_float, ctx.k_float = not mqa_checks.is_quantized(args.q), not mqa_checks.is_quantized(args.k)
    ctx.dtypes = (args.q.dtype, args.k.dtype, args.weights.dtype)
    ctx.sbk, ctx.unaligned = args.sparse_block_kv, args.unaligned_ks
    ctx.save_for_backward(args.q, args.q_sf, args.k, args.k_sf, args.weights, args.ks, args.ke, args.block_indices)


def _sparse_backward(ctx, grad):
    q, q_sf, k, k_sf, weights, ks, ke, block_indices = ctx.saved_tensors
    need_q = needs_grad(ctx, SPARSE, "q") and ctx.q_float
    need_k = needs_grad(ctx, SPARSE, "k") and ctx.k_float
    need_w = needs_grad(ctx, SPARSE, "weights")
    if not (need_q or need_k or need_w):
        return gradients(SPARSE)
    acc = mqa_checks.acc_dtype(q)
    qd, kd = portable.acc_values(q.detach(), q_sf, acc), portable.acc_values(k.detach(), k_sf, acc)
    shift = portable.sparse_shift(ks, ctx.sbk, ctx.unaligned)
    token, valid = portable.sparse_columns(ks, ke, shift, block_indices, ctx.sbk)
    dq, dk, dw = portable.sparse_backward(grad, qd, kd, token, valid, weights.detach(), acc, need_k)
    q_t, k_t, w_t = ctx.dtypes
    return gradients(
        SPARSE,
        q=dq.to(q_t) if need_q else None,
        k=dk.to(k_t) if need_k else None,
        weights=dw.to(w_t) if need_w else None,
    )


def _paged_sparse_setup(ctx, inputs, output):
    args = arguments(PAGED_SPARSE, inputs)
    q = args.q
    ctx.q_float = not mqa_checks.is_quantized(q)
    ctx.dtypes = (q.dtype, args.weights.dtype)
    ctx.fmt = mqa_checks.check_cache(
        mqa_checks.PAGED_SPARSE, args.kv_cache, mqa_checks.head_dim(q), args.ascend_kv_layout, q
    )
    ctx.sbk = args.sparse_block_kv
    ctx.save_for_backward(
        q, args.q_sf, args.kv_cache, args.weights, args.context_lens, args.block_table, args.block_indices
    )


def _paged_sparse_backward(ctx, grad):
    q, q_sf, kv_cache, weights, context_lens, block_table, block_indices = ctx.saved_tensors
    need_q, need_w = needs_grad(ctx, PAGED_SPARSE, "q") and ctx.q_float, needs_grad(ctx, PAGED_SPARSE, "weights")
    if not (need_q or need_w):
        return gradients(PAGED_SPARSE)
    acc = mqa_checks.acc_dtype(q)
    qd, kd, token, valid = portable.paged_sparse_operands(
        q.detach(), q_sf, kv_cache, ctx.fmt, context_lens, block_table, block_indices, ctx.sbk, acc
    )
    dq, _, dw = portable.sparse_backward(grad, qd, kd, token, valid, weights.detach(), acc, False)
    q_t, w_t = ctx.dtypes
    return gradients(
        PAGED_SPARSE, q=dq.reshape(q.shape).to(q_t) if need_q else None, weights=dw.to(w_t) if need_w else None
    )


autograd(SPARSE, _sparse_backward, _sparse_setup)
autograd(PAGED_SPARSE, _paged_sparse_backward, _paged_sparse_setup)
