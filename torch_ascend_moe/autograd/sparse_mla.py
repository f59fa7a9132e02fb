"""Backward of ``sparse_mla_prefill`` (upstream has none; DSA training needs one): the softmax weights are recomputed
chunk by chunk from the selected rows, so no ``[s_q, s_kv]`` (nor ``[s_q, h, topk]`` beyond a chunk) is kept.

With ``p_j = exp(s_j - L)`` (L the normaliser, sink included), ``dp_j = dout . v_j`` and ``D = sum_j p_j dp_j``
(= dout . out): ``ds_j = p_j (dp_j - D) + dlse * exp(s_j - lse)``; ``dq = sm_scale * sum_j ds_j k_j``; the selected
rows get ``sm_scale * sum_h ds_j q`` (all of d_qk) and ``sum_h p_j dout`` (the first d_v columns), scattered back
to their KV rows (repeated indices add up); ``dsink_h = -sum_i exp(sink_h - L_ih) D_ih``. ``max_logits`` is not
differentiable (marked so).
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad
from torch_ascend_moe.backends.portable.sparse_mla import (
    decode_composition,
    query_chunks,
    selected,
    softmax_parts,
    weights,
)
from torch_ascend_moe.checks.sparse_mla import accumulator

_NAME = "sparse_mla_prefill"


def _setup(ctx, inputs, output):
    args = arguments(_NAME, inputs)
    ctx.sm_scale, ctx.d_v = args.sm_scale, args.d_v
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(args.q, args.kv, args.indices, args.attn_sink, args.topk_length)


def _backward(ctx, grad_out, _grad_max_logits, grad_lse):
    q, kv, indices, attn_sink, topk_length = ctx.saved_tensors
    acc, (s_q, h_q, d_qk), d_v = accumulator(q.dtype), q.shape, ctx.d_v
    want_q, want_kv = needs_grad(ctx, _NAME, "q"), needs_grad(ctx, _NAME, "kv")
    want_sink = attn_sink is not None and needs_grad(ctx, _NAME, "attn_sink")
    grad_q = torch.zeros(s_q, h_q, d_qk, dtype=acc, device=q.device) if want_q else None
    grad_kv = torch.zeros(kv.shape[0], d_qk, dtype=acc, device=kv.device) if want_kv else None
    grad_sink = torch.zeros(h_q, dtype=acc, device=q.device) if want_sink else None
    for start, end in query_chunks(s_q, indices.shape[2], d_qk, h_q):
        valid, rows = selected(kv, indices, topk_length, start, end, acc)
        q_c = q[start:end].to(acc)
        logits, lse, norm = softmax_parts(q_c, rows, valid, ctx.sm_scale, attn_sink)
        p = weights(logits, norm)
        dout = grad_out[start:end].to(acc) if grad_out is not None else torch.zeros_like(q_c[..., :d_v])
        dp = torch.einsum("chd,ctd->cht", dout, rows[..., :d_v])
        big_d = (p * dp).sum(dim=-1)
        ds = p * (dp - big_d[..., None])
        if grad_lse is not None:
            ds = ds + grad_lse[start:end].to(acc)[..., None] * weights(logits, lse)
        if grad_q is not None:
            grad_q[start:end] = ctx.sm_scale * torch.einsum("cht,ctd->chd", ds, rows)
        if grad_kv is not None:
            d_rows = ctx.sm_scale * torch.einsum("cht,chd->ctd", ds, q_c)
            d_rows[..., :d_v] += torch.einsum("cht,chd->ctd", p, dout)
            idx = indices[start:end, 0, :].long()
            grad_kv.index_add_(0, idx[valid], d_rows[valid])
        if grad_sink is not None:
            share = torch.exp(attn_sink.to(acc)[None, :] - norm)
            grad_sink -= torch.where(big_d == 0, 0, share * big_d).sum(dim=0)
    return gradients(
        _NAME,
        q=None if grad_q is None else grad_q.to(q.dtype),
        kv=None if grad_kv is None else grad_kv.to(kv.dtype)[:, None, :],
        attn_sink=None if grad_sink is None else grad_sink.to(attn_sink.dtype),
    )


autograd(_NAME, _backward, _setup)


_DECODE = "sparse_mla_decode"


_CACHE_ARGS = ("k_cache", "indices", "topk_length", "extra_k_cache", "extra_indices", "extra_topk_length")


def _decode_setup(ctx, inputs, output):
    args = arguments(_DECODE, inputs)
    ctx.sm_scale, ctx.d_v = args.sm_scale, args.d_v
    ctx.save_for_backward(args.q, args.attn_sink, *(getattr(args, name) for name in _CACHE_ARGS))


def _decode_backward(ctx, grad_out, grad_lse):
    """q and the sink (the caches are bytes): the decode's composition (records -> prefill op) rebuilt with
    autograd, so the prefill's backward gives the gradients."""
    q, attn_sink, *cache = ctx.saved_tensors
    k_cache, indices, topk_length, extra_k_cache, extra_indices, extra_topk_length = cache
    want_sink = attn_sink is not None and needs_grad(ctx, _DECODE, "attn_sink")
    with torch.enable_grad():
        q_ = q.detach().requires_grad_()
        sink_ = attn_sink.detach().requires_grad_(want_sink) if attn_sink is not None else None
        out, lse = decode_composition(
            q_, k_cache, indices, ctx.sm_scale, ctx.d_v, sink_, topk_length, extra_k_cache, extra_indices,
            extra_topk_length,
        )  # fmt: skip
        pairs = [(o, g) for o, g in ((out, grad_out), (lse, grad_lse)) if g is not None]
        inputs = [q_] + ([sink_] if want_sink else [])
        grads = torch.autograd.grad([o for o, _ in pairs], inputs, [g for _, g in pairs], allow_unused=True)
    return gradients(_DECODE, q=grads[0], attn_sink=grads[1] if want_sink else None)


autograd(_DECODE, _decode_backward, _decode_setup)
