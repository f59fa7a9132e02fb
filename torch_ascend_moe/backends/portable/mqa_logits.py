"""Device-generic mqa_logits kernels with torch ops (what CUDA and NPU register until fused kernels exist).

Scores are formed for a block of queries at a time (``chunk`` queries x H heads x S_kv keys), so peak
memory stays bounded however long the sequence. The paged kernel gathers each request's blocks, dequantizes
them and runs the ragged formula in its compressed layout (column t = KV position t of the request).
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks import mqa_logits as mqa_checks
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.quant import decode_e2m1, unpack_e2m1
from torch_ascend_moe.quant.reference import decoded, dequantized

_SCORE_ELEMENTS = 1 << 24  # elements of one [queries, H, S_kv] score block


def acc_values(x: torch.Tensor, sf: torch.Tensor | None, acc: torch.dtype) -> torch.Tensor:
    """``x``'s values in ``acc``: float data as is; FP8/FP4 times its ``1 x g`` scales (none: 1)."""
    if not mqa_checks.is_quantized(x):
        return x.to(acc)
    if sf is None:
        return decoded(x).to(acc)
    width = 2 * x.shape[-1] if mqa_checks.is_fp4(x) else x.shape[-1]
    return dequantized(x, sf, (1, width // sf.shape[-1])).to(acc)


def _positions(ks, ke, columns: int, compressed: bool, device):
    """(KV position of each output column [S, columns], mask of the valid columns)."""
    cols = torch.arange(columns, device=device)
    j = cols + ks.long().unsqueeze(1) if compressed else cols.expand(ks.shape[0], -1)
    valid = (j >= ks.long().unsqueeze(1)) & (j < ke.long().unsqueeze(1))
    return j, valid


def logits_from_dequantized(qd, kd, weights, ks, ke, columns: int, compressed: bool, acc: torch.dtype):
    """The formula on dequantized operands, ``chunk`` queries at a time; -inf outside the ranges."""
    S, H = qd.shape[0], qd.shape[1]
    out = torch.full((S, columns), float("-inf"), dtype=acc, device=qd.device)
    if S == 0 or columns == 0 or kd.shape[0] == 0:
        return out
    j, valid = _positions(ks, ke, columns, compressed, qd.device)
    w = weights.to(acc)
    chunk = max(1, _SCORE_ELEMENTS // max(1, H * kd.shape[0]))
    for i0 in range(0, S, chunk):
        sl = slice(i0, i0 + chunk)
        scores = torch.einsum("ihd,jd->ihj", qd[sl], kd).relu_()
        logits = torch.einsum("ihj,ih->ij", scores, w[sl])
        gathered = logits.gather(1, j[sl].clamp(max=kd.shape[0] - 1))
        out[sl] = torch.where(valid[sl], gathered, out[sl])
    return out


@portable_kernel
def mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype):
    sh = mqa_checks.mqa_signature(mqa_checks.OP, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype)
    if capture.host_readable(ks):  # a host read: skipped while a graph is captured
        mqa_checks.check_range_values(mqa_checks.OP, ks, ke, sh.S_kv, max_seqlen_k)
    acc = mqa_checks.acc_dtype(q)
    qd, kd = acc_values(q, q_sf, acc), acc_values(k, k_sf, acc)
    columns = max_seqlen_k if max_seqlen_k > 0 else sh.S_kv
    return logits_from_dequantized(qd, kd, weights, ks, ke, columns, max_seqlen_k > 0, acc).to(sh.out_dtype)


@portable_kernel
def mqa_logits_backward(grad, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, output_mask):
    sh = mqa_checks.backward_signature(grad, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k)
    if capture.host_readable(ks):
        mqa_checks.check_range_values(mqa_checks.BACKWARD, ks, ke, sh.S_kv, max_seqlen_k)
    acc = mqa_checks.acc_dtype(q)
    qd, kd, w = acc_values(q, q_sf, acc), acc_values(k, k_sf, acc), weights.to(acc)
    compressed = max_seqlen_k > 0
    columns = grad.shape[1]
    dq, dk, dw = torch.zeros_like(qd), torch.zeros_like(kd), torch.zeros_like(w)
    if sh.S and columns and sh.S_kv:
        j, valid = _positions(ks, ke, columns, compressed, q.device)
        # The gradient scattered back to absolute KV positions: g[i, j].
        g_cols = torch.where(valid, grad.to(acc), 0)
        chunk = max(1, _SCORE_ELEMENTS // max(1, sh.H * sh.S_kv))
        for i0 in range(0, sh.S, chunk):
            sl = slice(i0, i0 + chunk)
            g = torch.zeros(g_cols[sl].shape[0], sh.S_kv, dtype=acc, device=q.device)
            g.scatter_add_(1, j[sl].clamp(max=sh.S_kv - 1), g_cols[sl])
            # The KV positions each query's logits hold: the others contribute nothing, even NaN (a where, not a
            # multiply by a zero gradient), as the C++ kernel, which never visits them.
            seen = (
                torch.zeros_like(g, dtype=torch.int32).scatter_add_(1, j[sl].clamp(max=sh.S_kv - 1), valid[sl].int())
                > 0
            )
            scores = torch.einsum("ihd,jd->ihj", qd[sl], kd)
            live = seen.unsqueeze(1)
            dw[sl] = torch.einsum("ij,ihj->ih", g, torch.where(live, scores.relu(), 0))
            p = torch.where(live & (scores > 0), g.unsqueeze(1) * w[sl].unsqueeze(-1), 0)
            dq[sl] = torch.einsum("ihj,jd->ihd", p, kd)
            dk += torch.einsum("ihj,ihd->jd", p, qd[sl])
    # One fresh empty tensor per unrequested output: outputs must not alias each other.
    return tuple(t if need else q.new_empty(0, dtype=acc) for t, need in zip((dq, dk, dw), output_mask))


def paged_kv(kv_cache, fmt: mqa_checks.CacheFormat, block_table, d: int, acc: torch.dtype) -> torch.Tensor:
    """Every request's blocks dequantized: ``[B, max_blocks * block_kv, D]`` (ids clamped into range; the
    columns past a request's length are masked by the caller)."""
    nb, bkv = kv_cache.shape[0], fmt.block_kv
    blocks = kv_cache.flatten(1)  # [nb, block_kv * bytes per token]: token rows are packed in a block
    data = blocks[:, : bkv * fmt.data_bytes].reshape(nb, bkv, fmt.data_bytes)
    sf = blocks[:, bkv * fmt.data_bytes :].reshape(nb, bkv, fmt.sf_bytes)
    values = decode_e2m1(unpack_e2m1(data)) if fmt.fp4 else data.contiguous().view(torch.float8_e4m3fn).float()
    if fmt.fp32_scale:
        values = values * sf.contiguous().view(torch.float32)
    else:
        # UE8M0 code c is 2^(c - 127) (integer math: Inductor has no float8_e8m0fnu codegen).
        codes = sf[..., : d // 32].int()
        scales = torch.where(codes == 255, torch.nan, torch.pow(2.0, codes - 127))  # 255 is NaN, not 2^128
        values = values * scales.repeat_interleave(32, dim=-1)
    ids = block_table.long().clamp(0, max(nb - 1, 0))
    return values.to(acc)[ids].reshape(block_table.shape[0], -1, d)


def paged_as_ragged(q, q_sf, kv_cache, fmt, block_table, context_lens, acc):
    """(q [B * next_n, H, D], k [B * max_blocks * block_kv, D], ks, ke) of the equivalent ragged call."""
    B, next_n, H = q.shape[0], q.shape[1], q.shape[2]
    d = mqa_checks.head_dim(q)
    kd = paged_kv(kv_cache, fmt, block_table, d, acc)
    span = kd.shape[1]
    # Tokens past a request's longest context are whatever the cache holds (stale or uninitialized bytes,
    # possibly NaN codes): zero them so the backward's products with zero gradients stay zero.
    live = torch.arange(span, device=q.device) < context_lens.amax(dim=1, keepdim=True)
    kd = torch.where(live.unsqueeze(-1), kd, 0)
    ks = (torch.arange(B, device=q.device) * span).repeat_interleave(next_n)
    ke = ks + context_lens.flatten().long()
    qd = acc_values(q, q_sf, acc).reshape(B * next_n, H, d)
    return qd, kd.reshape(-1, d), ks, ke


@portable_kernel
def paged_mqa_logits(
    q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
):
    _, fmt, out = mqa_checks.paged_signature(
        q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
    )
    if capture.host_readable(context_lens):
        mqa_checks.check_paged_values(
            context_lens, block_table, max_context_len, fmt.block_kv, kv_cache.shape[0], indices
        )
    acc = mqa_checks.acc_dtype(q)
    qd, kd, ks, ke = paged_as_ragged(q, q_sf, kv_cache, fmt, block_table, context_lens, acc)
    return logits_from_dequantized(qd, kd, weights, ks, ke, max_context_len, True, acc).to(out)


@portable_kernel
def paged_mqa_logits_metadata(context_lens, block_kv, num_sms, indices):
    mqa_checks.metadata_signature(context_lens, block_kv, num_sms, indices)
    lens = context_lens.tolist()
    mqa_checks.check_context_lens_values(mqa_checks.METADATA, lens)
    ids = indices.tolist() if indices is not None else None
    units, b = [], 0
    while b < len(lens):
        e = b + 1
        while ids is not None and e < len(lens) and ids[e] == ids[b]:
            e += 1
        extent = lens[e - 1][-1] if lens[e - 1] else 0
        units.append(-(-extent // mqa_checks.SCHEDULE_SPLIT) * (e - b))
        b = e
    total, rows = sum(units), []
    request = consumed = 0
    for sm in range(num_sms + 1):
        start = sm * (total // num_sms) + min(sm, total % num_sms)
        while request < len(units) and consumed + units[request] <= start < total:
            consumed += units[request]
            request += 1
        rows.append((len(units), 0) if start >= total else (request, start - consumed))
    return torch.tensor(rows, dtype=torch.int32).to(context_lens.device)


@portable_kernel
def mqa_topk(logits, ks, ke, topk, compressed):
    mqa_checks.topk_signature(logits, ks, ke, topk)
    if capture.host_readable(ks):
        mqa_checks.check_topk_values(ks, ke, logits.shape[1], compressed)
    return _topk_of(logits, ks, ke, topk, compressed)


def _topk_of(logits, ks, ke, topk: int, compressed: bool):
    """``mqa_topk``'s selection (after its checks)."""
    S, columns = logits.shape
    j, valid = _positions(ks, ke, columns, compressed, logits.device)
    # Value descending (NaN as +inf), ties to the lower position; then valid columns before invalid ones.
    values = logits.double().nan_to_num(nan=float("inf"), posinf=float("inf"), neginf=float("-inf"))
    by_value = torch.sort(-values, dim=1, stable=True).indices
    by_validity = torch.sort((~valid).gather(1, by_value).to(torch.int8), dim=1, stable=True).indices
    order = by_value.gather(1, by_validity)[:, :topk]
    n = valid.sum(1, keepdim=True)
    keep = torch.arange(order.shape[1], device=logits.device) < n
    idx = torch.where(keep, j.gather(1, order), -1).to(torch.int32)
    val = torch.where(keep, logits.gather(1, order), float("-inf"))
    pad = topk - order.shape[1]
    if pad:
        idx = torch.nn.functional.pad(idx, (0, pad), value=-1)
        val = torch.nn.functional.pad(val, (0, pad), value=float("-inf"))
    return val, idx


@portable_kernel
def mqa_logits_topk(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype, *, block_logits=None):
    """``mqa_topk(mqa_logits(...))`` a block of queries at a time: the logits held are ``[chunk, S_kv]``, with
    ``chunk`` fixed by the shapes (no host read: capturable), never ``[S, S_kv]``. ``block_logits(rows)`` gives the
    logits (in the logits dtype) of the queries ``rows`` (a slice): a device's own logits kernel (CUDA's Triton
    one); by default the formula on dequantized copies."""
    sh = mqa_checks.fused_signature(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype)
    if capture.host_readable(ks):
        mqa_checks.check_range_values(mqa_checks.FUSED, ks, ke, sh.S_kv, 0)
    if block_logits is None:
        acc = mqa_checks.acc_dtype(q)
        qd, kd = acc_values(q, q_sf, acc), acc_values(k, k_sf, acc)

        def block_logits(rows):
            logits = logits_from_dequantized(qd[rows], kd, weights[rows], ks[rows], ke[rows], sh.S_kv, False, acc)
            return logits.to(sh.out_dtype)

    values = q.new_empty(sh.S, topk, dtype=sh.out_dtype)
    indices = q.new_empty(sh.S, topk, dtype=torch.int32)
    chunk = max(1, _SCORE_ELEMENTS // max(1, sh.S_kv))
    for i0 in range(0, sh.S, chunk):
        rows = slice(i0, i0 + chunk)
        values[rows], indices[rows] = _topk_of(block_logits(rows), ks[rows], ke[rows], topk, False)
    return values, indices


# ---- sparse: candidate KV blocks (DeepSeek V4.1's hierarchical indexer) ----


def sparse_columns(lo, hi, shift, block_indices, sbk: int):
    """(KV token of each output column ``[R, num_blocks * SBK]`` (int64), mask of the valid columns): column
    ``s * SBK + o`` is token ``block_indices[r, s] * SBK + shift[r] + o``, valid in the first
    ``min(num_blocks, ceil((hi - lo) / SBK))`` slots when inside ``[lo, hi)``. Padding ids are never trusted. Callers
    index with ``where(valid, token, 0)`` (valid tokens are in range)."""
    R, nb = block_indices.shape
    cols = torch.arange(nb * sbk, device=block_indices.device)
    slot, offset = cols // sbk, cols % sbk
    lo, hi = lo.long().unsqueeze(1), hi.long().unsqueeze(1)
    n = torch.minimum((hi - lo + sbk - 1).div(sbk, rounding_mode="floor"), torch.full_like(hi, nb))
    # repeat_interleave, not block_indices[:, cols // sbk]: torch 2.13's Inductor emits C++ that does not compile
    # for that gather's bounds check with a dynamic num_blocks (CPU, vectorized int64 compare).
    token = block_indices.long().repeat_interleave(sbk, dim=1) * sbk + offset + shift.long().unsqueeze(1)
    valid = (slot < n) & (token >= lo) & (token < hi)
    return token, valid


def sparse_keys(kd, token, valid):
    """The keys of the columns ``[R, C, D]`` from ``kd [N, D]`` (zero at invalid columns: their bytes may be anything,
    and a backward must not multiply a NaN by a zero gradient)."""
    if kd.shape[0] == 0:
        return kd.new_zeros(*token.shape, kd.shape[1])
    keys = kd[torch.where(valid, token, 0)]
    return torch.where(valid.unsqueeze(-1), keys, 0)


def sparse_from_keys(qd, kd, token, valid, weights, acc):
    """Sparse logits ``[R, C]`` in ``acc``: the dense formula on the gathered keys, -inf at invalid columns;
    ``chunk`` rows at a time."""
    R, H = qd.shape[0], qd.shape[1]
    C = token.shape[1]
    out = torch.full((R, C), float("-inf"), dtype=acc, device=qd.device)
    if R == 0 or C == 0:
        return out
    w = weights.to(acc)
    chunk = max(1, _SCORE_ELEMENTS // max(1, H * C))
    for i0 in range(0, R, chunk):
        sl = slice(i0, i0 + chunk)
        keys = sparse_keys(kd, token[sl], valid[sl])
        scores = torch.einsum("ihd,icd->ihc", qd[sl], keys).relu_()
        out[sl] = torch.where(valid[sl], torch.einsum("ihc,ih->ic", scores, w[sl]), out[sl])
    return out


def sparse_backward(grad, qd, kd, token, valid, weights, acc, need_k: bool):
    """(dq [R, H, D], dk [N, D] or None, dw [R, H]) of ``sparse_from_keys`` w.r.t. the dequantized operands."""
    w = weights.to(acc)
    g = torch.where(valid, grad.to(acc), 0)
    dq, dw = torch.zeros_like(qd), torch.zeros_like(w)
    dk = torch.zeros_like(kd) if need_k else None
    R, H, C = qd.shape[0], qd.shape[1], token.shape[1]
    chunk = max(1, _SCORE_ELEMENTS // max(1, H * C))
    for i0 in range(0, R if C else 0, chunk):
        sl = slice(i0, i0 + chunk)
        keys = sparse_keys(kd, token[sl], valid[sl])
        scores = torch.einsum("ihd,icd->ihc", qd[sl], keys)
        live = valid[sl].unsqueeze(1)
        dw[sl] = torch.einsum("ic,ihc->ih", g[sl], torch.where(live, scores.relu(), 0))
        p = torch.where(live & (scores > 0), g[sl].unsqueeze(1) * w[sl].unsqueeze(-1), 0)
        dq[sl] = torch.einsum("ihc,icd->ihd", p, keys)
        if need_k and kd.shape[0]:
            per_key = torch.einsum("ihc,ihd->icd", p, qd[sl]).reshape(-1, kd.shape[1])
            tokens = torch.where(valid[sl], token[sl], 0).reshape(-1)
            dk.index_add_(0, tokens, per_key)
    return dq, dk, dw


def sparse_shift(ks, sbk: int, unaligned: bool):
    return ks.long() % sbk if unaligned else torch.zeros_like(ks, dtype=torch.long)


@portable_kernel
def sparse_mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, unaligned_ks, logits_dtype):
    sh, _ = mqa_checks.sparse_signature(q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, logits_dtype)
    if capture.host_readable(ks):
        mqa_checks.check_sparse_values(ks, ke, block_indices, sparse_block_kv, unaligned_ks, sh.S_kv)
    acc = mqa_checks.acc_dtype(q)
    qd, kd = acc_values(q, q_sf, acc), acc_values(k, k_sf, acc)
    shift = sparse_shift(ks, sparse_block_kv, unaligned_ks)
    token, valid = sparse_columns(ks, ke, shift, block_indices, sparse_block_kv)
    return sparse_from_keys(qd, kd, token, valid, weights, acc).to(sh.out_dtype)


def paged_sparse_operands(q, q_sf, kv_cache, fmt, context_lens, block_table, block_indices, sbk: int, acc):
    """(qd [R, H, D], every request's keys flattened [B * span, D], column tokens into them, valid mask)."""
    B, next_n, H = q.shape[0], q.shape[1], q.shape[2]
    d = mqa_checks.head_dim(q)
    kd = paged_kv(kv_cache, fmt, block_table, d, acc)  # [B, span, D]
    span = kd.shape[1]
    lens = context_lens.reshape(-1)
    zero = torch.zeros_like(lens, dtype=torch.long)
    token, valid = sparse_columns(zero, lens, zero, block_indices, sbk)
    valid = valid & (token < span)
    base = (torch.arange(B, device=q.device) * span).repeat_interleave(next_n).unsqueeze(1)
    qd = acc_values(q, q_sf, acc).reshape(B * next_n, H, d)
    return qd, kd.reshape(-1, d), torch.where(valid, token, 0) + base, valid


@portable_kernel
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
    _, fmt, out, _ = mqa_checks.paged_sparse_signature(
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
    if capture.host_readable(context_lens):
        mqa_checks.check_paged_sparse_values(
            context_lens, block_table, block_indices, sparse_block_kv, fmt.block_kv, kv_cache.shape[0]
        )
    acc = mqa_checks.acc_dtype(q)
    qd, kd, token, valid = paged_sparse_operands(
        q, q_sf, kv_cache, fmt, context_lens, block_table, block_indices, sparse_block_kv, acc
    )
    return sparse_from_keys(qd, kd, token, valid, weights, acc).to(out)
