"""The Triton kernel behind ``mqa_logits`` on CUDA: the indexer's logits
``logits[i, j] = sum_h w[i, h] * relu(deq(q)[i, h] . deq(k)[j])`` for ``ks[i] <= j < ke[i]``, exactly -inf elsewhere,
tiled so that no ``[S, H, S_kv]`` score tensor exists: each program takes ``BM`` queries (all their heads, ``BM *
BH`` score rows) against ``BN`` keys, forms the ``[BM * BH, BN]`` scores in one dot, and sums the heads with their
weights in registers. A key block that no query of the block sees is skipped.

Operands: BF16 (a BF16 dot on the GPU, FP32 sums: the products are exact) or FP32 / FP8 E4M3 / packed FP4 with
FP32 or E8M0 scales per ``1 x g`` block, dequantized in the tile to FP32 (value times its block's scale, as the C++
kernel dequantizes) and multiplied in an IEEE FP32 dot (no TF32). Full ``[S, S_kv]`` or compressed ``[S, max_seqlen_k]``
(column ``t`` = position ``ks[i] + t``) outputs, FP32 or BF16 (rounded once, to nearest even).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.cuda._triton import (
    INTERPRETED,
    decode_e2m1_to_e4m3,
    decode_ue8m0,
    device_refusal,
    launch,
    load_scales,
    store_result,
    tl,
    triton,
)

BLOCK_N = 32
ROWS = 64  # score rows (queries x padded heads) per program


def refusal(q: torch.Tensor) -> str | None:
    """Why the kernel does not run here, or None: FP8 loads need sm89+ (the interpreter on CPU tensors)."""
    return device_refusal(q.device)


def heads_block(h: int) -> int:
    """Heads padded to a power of two, at least 16 rows per dot."""
    return max(16, triton.next_power_of_2(h))


def mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, columns: int, compressed: bool, out: torch.Tensor) -> torch.Tensor:
    """Fill ``out [S, columns]`` (FP32 or BF16, pre-filled with -inf where no key is visible: the kernel writes
    only the visible positions and -inf over the rest of each key block it visits)."""
    s, h = q.shape[0], q.shape[1]
    d = 2 * q.shape[2] if q.dtype == torch.uint8 else q.shape[2]
    s_kv = k.shape[0]
    bh = heads_block(h)
    bm = max(1, ROWS // bh)
    bd = triton.next_power_of_2(d)
    q_scale, q_ue8m0, gq = _scales(q_sf, d)
    k_scale, k_ue8m0, gk = _scales(k_sf, d)
    grid = (triton.cdiv(s, bm), triton.cdiv(s_kv, BLOCK_N))
    launch(
        _mqa_logits_kernel,
        grid,
        q,
        q_scale if q_scale is not None else q,
        k,
        k_scale if k_scale is not None else k,
        weights,
        ks,
        ke,
        out,
        s,
        h,
        d,
        s_kv,
        columns,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        *(q_scale.stride() if q_scale is not None else (0, 0, 0)),
        *(k_scale.stride() if k_scale is not None else (0, 0)),
        weights.stride(0),
        weights.stride(1),
        out.stride(0),
        out.stride(1),
        Q_KIND=_kind(q),
        K_KIND=_kind(k),
        Q_SCALED=q_scale is not None,
        K_SCALED=k_scale is not None,
        Q_UE8M0=q_ue8m0,
        K_UE8M0=k_ue8m0,
        GQ=gq,
        GK=gk,
        COMPRESSED=compressed,
        OUT_BF16=out.dtype == torch.bfloat16,
        BM=bm,
        BH=bh,
        BN=BLOCK_N,
        BD=bd,
        # Triton's interpreter (3.9) gets BF16 dots wrong: it multiplies the operands widened to FP32 instead
        # (the same exact products; the GPU's tensor cores take BF16 directly).
        BF16_DOT=not INTERPRETED,
    )
    return out


_BF16, _FP32, _FP8, _FP4 = 0, 1, 2, 3


def _kind(x: torch.Tensor) -> int:
    return {torch.bfloat16: _BF16, torch.float32: _FP32, torch.float8_e4m3fn: _FP8, torch.uint8: _FP4}[x.dtype]


def _scales(sf, d: int):
    """(scale tensor as the kernel reads it, UE8M0 codes?, block size g) of an operand's optional scales."""
    if sf is None:
        return None, False, d
    g = d // sf.shape[-1]
    if sf.dtype == torch.float8_e8m0fnu:
        return sf.view(torch.uint8), True, g
    return sf, False, g


@triton.jit
def _load_rows(base, rows, row_mask, s_row, s_col, D, KIND: tl.constexpr, BD: tl.constexpr):
    """``[len(rows), BD]`` FP32 values (BF16 kept as BF16) of ``rows``, columns past D zero. FP4 is decoded."""
    # One return per static branch, no statement after them (see _scaled_gemm._load_operand).
    if KIND == 3:  # packed FP4: byte j holds elements 2j (low nibble) and 2j + 1
        cols = tl.arange(0, BD // 2)
        mask = row_mask[:, None] & (cols[None, :] < D // 2)
        byte = tl.load(base + rows[:, None] * s_row + cols[None, :] * s_col, mask=mask, other=0)
        lo = decode_e2m1_to_e4m3(byte, False).to(tl.float32)
        hi = decode_e2m1_to_e4m3(byte, True).to(tl.float32)
        values = tl.reshape(tl.join(lo, hi), (rows.shape[0], BD))
    else:
        cols = tl.arange(0, BD)
        mask = row_mask[:, None] & (cols[None, :] < D)
        x = tl.load(base + rows[:, None] * s_row + cols[None, :] * s_col, mask=mask, other=0.0)
        if KIND == 0:
            values = x
        else:
            values = x.to(tl.float32)
    return values


@triton.jit
def _scaled(x, sf_base, scale_rows, row_mask, s_row, s_col, G: tl.constexpr, UE8M0: tl.constexpr, BD: tl.constexpr):
    """``x`` (FP32 ``[R, BD]``) times each element's block scale: column ``c`` of row ``r`` takes
    ``sf[scale_rows[r], c // G]`` (rows where ``row_mask`` is off keep scale 1)."""
    cols = tl.arange(0, BD) // G
    ptr = sf_base + scale_rows[:, None] * s_row + cols[None, :] * s_col
    return x * load_scales(ptr, row_mask[:, None], UE8M0)


@triton.jit
def _mqa_logits_kernel(
    q,
    q_sf,
    k,
    k_sf,
    w,
    ks,
    ke,
    out,
    S,
    H,
    D,
    S_KV,
    COLUMNS,
    s_qi,
    s_qh,
    s_qd,
    s_kj,
    s_kd,
    s_sqi,
    s_sqh,
    s_sqb,
    s_skj,
    s_skb,
    s_wi,
    s_wh,
    s_oi,
    s_oc,
    Q_KIND: tl.constexpr,
    K_KIND: tl.constexpr,
    Q_SCALED: tl.constexpr,
    K_SCALED: tl.constexpr,
    Q_UE8M0: tl.constexpr,
    K_UE8M0: tl.constexpr,
    GQ: tl.constexpr,
    GK: tl.constexpr,
    COMPRESSED: tl.constexpr,
    OUT_BF16: tl.constexpr,
    BM: tl.constexpr,
    BH: tl.constexpr,
    BN: tl.constexpr,
    BD: tl.constexpr,
    BF16_DOT: tl.constexpr,
):
    qi = tl.program_id(0) * BM + tl.arange(0, BM)  # queries of this program
    q_ok = qi < S
    start = tl.load(ks + qi, mask=q_ok, other=0).to(tl.int64)
    end = tl.load(ke + qi, mask=q_ok, other=0).to(tl.int64)
    j = tl.program_id(1) * BN + tl.arange(0, BN)  # keys of this program
    visible = q_ok[:, None] & (j[None, :] >= start[:, None]) & (j[None, :] < end[:, None])  # [BM, BN]
    if tl.max(visible.to(tl.int32)) > 0:
        # Score rows r = query * BH + head; heads past H are masked rows.
        r = tl.arange(0, BM * BH)
        row_q = tl.program_id(0) * BM + r // BH
        head = r % BH
        row_ok = (row_q < S) & (head < H)
        q_rows = row_q.to(tl.int64) * s_qi + head.to(tl.int64) * s_qh
        qv = _load_rows(q, q_rows, row_ok, 1, s_qd, D, Q_KIND, BD)
        k_ok = j < S_KV
        kv = _load_rows(k, j.to(tl.int64) * s_kj, k_ok, 1, s_kd, D, K_KIND, BD)
        if Q_SCALED:
            sq_rows = row_q.to(tl.int64) * s_sqi + head.to(tl.int64) * s_sqh
            qv = _scaled(qv, q_sf, sq_rows, row_ok, 1, s_sqb, GQ, Q_UE8M0, BD)
        if K_SCALED:
            kv = _scaled(kv, k_sf, j.to(tl.int64) * s_skj, k_ok, 1, s_skb, GK, K_UE8M0, BD)
        if Q_KIND == 0 and K_KIND == 0 and BF16_DOT:
            scores = tl.dot(qv, tl.trans(kv))  # BF16 products are exact in FP32
        else:
            scores = tl.dot(qv.to(tl.float32), tl.trans(kv.to(tl.float32)), input_precision="ieee")
        wv = tl.load(w + row_q.to(tl.int64) * s_wi + head.to(tl.int64) * s_wh, mask=row_ok, other=0.0).to(tl.float32)
        # ReLU keeps NaN (as std::max(s, 0) in the C++ kernel): a NaN score reaches its query's logits.
        relu = tl.maximum(scores, 0.0, propagate_nan=tl.PropagateNan.ALL)
        weighted = tl.where(row_ok[:, None], relu * wv[:, None], 0.0)  # [BM * BH, BN]
        logits = tl.sum(tl.reshape(weighted, (BM, BH, BN)), axis=1)  # [BM, BN]
        logits = tl.where(visible, logits, float("-inf"))
        if COMPRESSED:
            col = j[None, :] - start[:, None]
            write = visible
        else:
            col = j[None, :] + tl.zeros((BM, BN), dtype=tl.int64)
            write = q_ok[:, None] & (j[None, :] < COLUMNS)
        ptr = out + qi.to(tl.int64)[:, None] * s_oi + col * s_oc
        store_result(ptr, logits, write, OUT_BF16)


# ---- paged decode ----


def paged_mqa_logits(q, q_sf, kv_cache, fmt, weights, context_lens, block_table, out: torch.Tensor) -> torch.Tensor:
    """Fill ``out [B * next_n, max_context_len]`` (pre-filled with -inf): row ``b * next_n + t`` scores the first
    ``context_lens[b, t]`` tokens of request ``b``, page by page through ``block_table[b]``, reading each page's
    FP8/FP4 token rows and their scales (FP32 per token, or UE8M0 per 32 elements) straight from the cache bytes.
    ``fmt``: the cache's ``checks.mqa_logits.CacheFormat``."""
    b, next_n, h = q.shape[0], q.shape[1], q.shape[2]
    d = 2 * q.shape[3] if q.dtype == torch.uint8 else q.shape[3]
    bh = heads_block(h)
    q_scale, q_ue8m0, gq = _scales(q_sf, d)
    rows, columns = b * next_n, out.shape[1]
    grid = (rows, triton.cdiv(columns, fmt.block_kv))
    q_flat = q.reshape(rows, h, q.shape[3])
    q_sf_flat = None if q_scale is None else q_scale.reshape(rows, h, q_scale.shape[-1])
    launch(
        _paged_kernel,
        grid,
        q_flat,
        q_sf_flat if q_sf_flat is not None else q_flat,
        kv_cache,
        weights,
        context_lens,
        block_table,
        out,
        h,
        d,
        columns,
        next_n,
        q_flat.stride(0),
        q_flat.stride(1),
        q_flat.stride(2),
        *(q_sf_flat.stride() if q_sf_flat is not None else (0, 0, 0)),
        kv_cache.stride(0),
        weights.stride(0),
        weights.stride(1),
        context_lens.stride(0),
        context_lens.stride(1),
        block_table.stride(0),
        block_table.stride(1),
        out.stride(0),
        out.stride(1),
        Q_KIND=_kind(q),
        Q_SCALED=q_scale is not None,
        Q_UE8M0=q_ue8m0,
        GQ=gq,
        KV_FP4=fmt.fp4,
        KV_FP32_SCALE=fmt.fp32_scale,
        DATA_BYTES=fmt.data_bytes,
        SF_BYTES=fmt.sf_bytes,
        BLOCK_KV=fmt.block_kv,
        OUT_BF16=out.dtype == torch.bfloat16,
        BH=bh,
        BD=triton.next_power_of_2(d),
    )
    return out


def paged_refusal(q, fmt) -> str | None:
    """Why the paged kernel does not take a call, or None: it needs a device it runs on, pages of a power-of-two
    token count (16 at least: one ``tl.dot``) and D a power of two."""
    d = 2 * q.shape[3] if q.dtype == torch.uint8 else q.shape[3]
    if fmt.block_kv < 16 or fmt.block_kv & (fmt.block_kv - 1):
        return f"pages of {fmt.block_kv} tokens (the kernel needs a power of two of at least 16)"
    if d & (d - 1):
        return f"head dim {d} is not a power of two"
    return device_refusal(q.device)


@triton.jit
def _paged_keys(
    page,
    D,
    KV_FP4: tl.constexpr,
    KV_FP32_SCALE: tl.constexpr,
    DATA_BYTES: tl.constexpr,
    SF_BYTES: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    BD: tl.constexpr,
):
    """``[BLOCK_KV, BD]`` FP32 dequantized keys of one cache page (``page``: its first byte): token rows of
    ``DATA_BYTES`` bytes, then ``BLOCK_KV`` scale rows of ``SF_BYTES`` bytes."""
    tok = tl.arange(0, BLOCK_KV)
    if KV_FP4:
        cols = tl.arange(0, BD // 2)
        byte = tl.load(page + tok[:, None] * DATA_BYTES + cols[None, :], mask=cols[None, :] < D // 2, other=0)
        lo = decode_e2m1_to_e4m3(byte, False).to(tl.float32)
        hi = decode_e2m1_to_e4m3(byte, True).to(tl.float32)
        values = tl.reshape(tl.join(lo, hi), (BLOCK_KV, BD))
    else:
        cols = tl.arange(0, BD)
        byte = tl.load(page + tok[:, None] * DATA_BYTES + cols[None, :], mask=cols[None, :] < D, other=0)
        values = byte.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    scales = page + BLOCK_KV * DATA_BYTES + tok * SF_BYTES
    if KV_FP32_SCALE:  # one little-endian FP32 per token
        word = tl.load(scales).to(tl.uint32)
        word = word | (tl.load(scales + 1).to(tl.uint32) << 8)
        word = word | (tl.load(scales + 2).to(tl.uint32) << 16)
        word = word | (tl.load(scales + 3).to(tl.uint32) << 24)
        values = values * word.to(tl.float32, bitcast=True)[:, None]
    else:
        d = tl.arange(0, BD)
        codes = tl.load(scales[:, None] + (d // 32)[None, :], mask=d[None, :] < D, other=127)
        values = values * decode_ue8m0(codes)
    return values


@triton.jit
def _paged_kernel(
    q,
    q_sf,
    cache,
    w,
    context_lens,
    block_table,
    out,
    H,
    D,
    COLUMNS,
    NEXT_N,
    s_qr,
    s_qh,
    s_qd,
    s_sqr,
    s_sqh,
    s_sqb,
    s_page,
    s_wr,
    s_wh,
    s_lb,
    s_lt,
    s_tb,
    s_tp,
    s_or,
    s_oc,
    Q_KIND: tl.constexpr,
    Q_SCALED: tl.constexpr,
    Q_UE8M0: tl.constexpr,
    GQ: tl.constexpr,
    KV_FP4: tl.constexpr,
    KV_FP32_SCALE: tl.constexpr,
    DATA_BYTES: tl.constexpr,
    SF_BYTES: tl.constexpr,
    BLOCK_KV: tl.constexpr,
    OUT_BF16: tl.constexpr,
    BH: tl.constexpr,
    BD: tl.constexpr,
):
    r = tl.program_id(0)
    p = tl.program_id(1)
    req = r // NEXT_N
    length = tl.load(context_lens + req * s_lb + (r % NEXT_N) * s_lt)
    j = p * BLOCK_KV + tl.arange(0, BLOCK_KV)
    if p * BLOCK_KV < length:
        page = cache + tl.load(block_table + req * s_tb + p * s_tp).to(tl.int64) * s_page
        keys = _paged_keys(page, D, KV_FP4, KV_FP32_SCALE, DATA_BYTES, SF_BYTES, BLOCK_KV, BD)
        head = tl.arange(0, BH)
        head_ok = head < H
        q_rows = r.to(tl.int64) * s_qr + head.to(tl.int64) * s_qh
        qv = _load_rows(q, q_rows, head_ok, 1, s_qd, D, Q_KIND, BD).to(tl.float32)
        if Q_SCALED:
            sq_rows = r.to(tl.int64) * s_sqr + head.to(tl.int64) * s_sqh
            qv = _scaled(qv, q_sf, sq_rows, head_ok, 1, s_sqb, GQ, Q_UE8M0, BD)
        scores = tl.dot(qv, tl.trans(keys), input_precision="ieee")  # [BH, BLOCK_KV]
        wv = tl.load(w + r * s_wr + head * s_wh, mask=head_ok, other=0.0).to(tl.float32)
        relu = tl.maximum(scores, 0.0, propagate_nan=tl.PropagateNan.ALL)
        logits = tl.sum(tl.where(head_ok[:, None], relu * wv[:, None], 0.0), axis=0)  # [BLOCK_KV]
        logits = tl.where(j < length, logits, float("-inf"))
        ptr = out + r.to(tl.int64) * s_or + j * s_oc
        store_result(ptr, logits, j < COLUMNS, OUT_BF16)


__all__ = ["BLOCK_N", "heads_block", "mqa_logits", "paged_mqa_logits", "paged_refusal", "refusal"]
