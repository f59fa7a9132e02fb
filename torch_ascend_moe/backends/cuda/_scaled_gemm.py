"""One Triton kernel for every block-scaled GEMM of the fp8_gemm and grouped families: ``fp8_gemm``, ``fp8_bmm``,
``m_grouped_fp8_gemm`` (psum and id layouts), ``m_grouped_fp8_gemm_masked``.

``out[r, n] = c[r, n] + alpha * sum_k deq(a)[r, k] * deq(b)[g(r), n, k]``, accumulated in FP32 and rounded once,
computed as DeepGEMM does: per K chunk of ``BK`` columns (``BK`` divides both operands' ``gran_k``, so each
chunk has one scale per row of A and per column of B) one FP8 ``tl.dot`` (exact products, FP32 sums; FP4
operands are decoded to the E4M3 values they equal), then ``acc += partial * sa[r] * sb[n]``. A chunk where a
value times its scale may not be finite (NaN/inf scales, scales past FP32_MAX / 448) or the scale product
overflows or underflows is computed by dequantizing in the tile and an IEEE FP32 dot instead, so NaN and
infinities land where the dequantize-then-multiply contract (the portable kernel) puts them.

Rows come as a schedule of M tiles, each ``(group, first row, end row)`` (``segment_tiles``), built on the device
from the layout: no host sync, so a call can be captured in a CUDA graph. A row map (``rows``) lets the id
layout read and write rows in place, sorted by group only through the map.
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe.backends.cuda._quant import cast_rows_e4m3
from torch_ascend_moe.backends.cuda._triton import (
    decode_e2m1_to_e4m3,
    device_refusal,
    launch,
    load_scales,
    scale_product,
    store_result,
    tl,
    triton,
)

BLOCK_M = 64
BLOCK_N = 64
MAX_BLOCK_K = 128


def block_k(recipe_a, recipe_b) -> int | None:
    """The K chunk: the largest power of two in [32, 128] dividing both ``gran_k`` (FP8 ``tl.dot`` takes K >= 32),
    or None when there is none (the caller keeps the portable kernel)."""
    g = math.gcd(recipe_a[1], recipe_b[1])
    bk = MAX_BLOCK_K
    while bk >= 32 and g % bk:
        bk //= 2
    return bk if bk >= 32 else None


def refusal(a: torch.Tensor, recipe_a, recipe_b) -> str | None:
    """Why the kernel does not take a call, or None: it needs a device it runs on and a K chunk both recipes
    allow."""
    if block_k(recipe_a, recipe_b) is None:
        return f"gran_k {recipe_a[1]} and {recipe_b[1]} share no power-of-two K chunk of 32..{MAX_BLOCK_K}"
    return device_refusal(a.device)


def segment_tiles(begins: torch.Tensor, ends: torch.Tensor, rows: int) -> torch.Tensor:
    """int32 ``[3, T]``: (group, first row, end row) of each M tile covering the segments ``[begins[g], ends[g])``
    (int64 ``[G]``, on the device; empty ones allowed), ``T = ceil(rows / BLOCK_M) + G`` (a bound on the tiles any
    layout of ``rows`` rows needs: static, so no host read); tiles past the last have no rows."""
    groups = begins.shape[0]
    counts = (ends - begins).clamp(min=0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    cum = torch.cumsum(tiles, 0)
    t = torch.arange(triton.cdiv(rows, BLOCK_M) + groups, device=begins.device)
    g = torch.searchsorted(cum, t, right=True)
    valid = g < groups
    gc = g.clamp(max=max(groups - 1, 0))
    first = begins[gc] + (t - (cum[gc] - tiles[gc])) * BLOCK_M
    end = torch.where(valid, torch.minimum(first + BLOCK_M, ends[gc]), first)
    return torch.stack([gc, first, end]).to(torch.int32)


def _scale_view(sf: torch.Tensor) -> tuple[torch.Tensor, bool]:
    return (sf.view(torch.uint8), True) if sf.dtype == torch.float8_e8m0fnu else (sf, False)


def _strides(t: torch.Tensor, batched: bool) -> tuple[int, int, int]:
    """(batch, row, column) element strides; batch 0 for a 2-D tensor shared by every group."""
    return (t.stride(0), t.stride(1), t.stride(2)) if batched else (0, t.stride(0), t.stride(1))


def scaled_gemm(
    a,
    sfa,
    b,
    sfb,
    recipe_a,
    recipe_b,
    out,
    tiles,
    *,
    rows_map=None,
    c=None,
    alpha=1.0,
    a_batched=False,
    quantize_a_ue8m0: bool | None = None,
) -> torch.Tensor:
    """Launch the kernel: writes ``out``'s scheduled rows (others untouched). ``a``/``sfa``/``c``/``out`` are
    ``[M, ...]`` or, with ``a_batched``, ``[G, M, ...]``; ``b``/``sfb`` ``[G, N, K]`` (or ``[N, K]`` for one group).

    ``quantize_a_ue8m0`` not None: ``a`` is BF16/FP32 and ``sfa`` None; each K chunk of a row (``BK`` must equal
    ``recipe_a``'s ``gran_k``: one scale block) is cast in the tile as ``quantize_fp8`` casts it (amax floored at
    1e-4 over 448, UE8M0 when True, E4M3 codes by ``_quant``'s integer rounding), so the product is the cast-then-GEMM
    composition's, bit for bit, without an FP8 copy of ``a`` in memory."""
    quant = quantize_a_ue8m0 is not None
    b_batched = b.dim() == 3
    n, k = b.shape[-2], 2 * b.shape[-1] if b.dtype == torch.uint8 else b.shape[-1]
    if quant and block_k(recipe_a, recipe_b) != recipe_a[1]:
        raise ValueError(f"scaled_gemm: a fused cast needs K chunks of gran_k={recipe_a[1]} (recipe_b {recipe_b})")
    sa, sa_ue8m0 = _scale_view(sfa if not quant else sfb)  # a placeholder when casting in the tile
    sb, sb_ue8m0 = _scale_view(sfb)
    cc = c if c is not None else out
    num_tiles = tiles.shape[1]
    grid = (num_tiles, triton.cdiv(n, BLOCK_N))
    launch(
        _scaled_gemm_kernel,
        grid,
        a,
        sa,
        b,
        sb,
        cc,
        out,
        rows_map if rows_map is not None else tiles,
        tiles,
        num_tiles,
        n,
        k,
        *_strides(a, a_batched),
        *(_strides(sa, a_batched) if not quant else (0, 0, 0)),
        *_strides(b, b_batched),
        *_strides(sb, b_batched),
        *_strides(cc, a_batched),
        *_strides(out, a_batched),
        float(alpha),
        GMN_A=recipe_a[0],
        GK_A=recipe_a[1],
        GMN_B=recipe_b[0],
        GK_B=recipe_b[1],
        A_FP4=a.dtype == torch.uint8,
        QUANT_A=quant,
        QA_UE8M0=bool(quantize_a_ue8m0),
        B_FP4=b.dtype == torch.uint8,
        SA_UE8M0=sa_ue8m0,
        SB_UE8M0=sb_ue8m0,
        HAS_C=c is not None,
        ROW_MAP=rows_map is not None,
        OUT_BF16=out.dtype == torch.bfloat16,
        BM=BLOCK_M,
        BN=BLOCK_N,
        BK=block_k(recipe_a, recipe_b),
    )
    return out


@triton.jit
def tile_of(tiles, num_tiles):
    """This program's (group, first row, end row) in a ``segment_tiles`` schedule."""
    t = tl.program_id(0)
    return tl.load(tiles + t).to(tl.int64), tl.load(tiles + num_tiles + t), tl.load(tiles + 2 * num_tiles + t)


@triton.jit
def tile_rows(rows_map, r0, r1, ROW_MAP: tl.constexpr, BM: tl.constexpr):
    """(rows, valid mask) of a tile: positions ``[r0, r1)``, through the row map when the layout has one."""
    pos = r0 + tl.arange(0, BM)
    m_mask = pos < r1
    if ROW_MAP:
        row = tl.load(rows_map + pos, mask=m_mask, other=0)
    else:
        row = pos
    return row, m_mask


@triton.jit
def _load_operand(base, idx, mask, k0, s_row, s_col, FP4: tl.constexpr, BK: tl.constexpr):
    """``[len(idx), BK]`` FP8 values of rows ``idx``, columns ``[k0, k0 + BK)`` (FP4: decoded from packed bytes)."""
    # One return after a static if/else: compiled Triton visits the statements after an early return in a
    # constexpr branch too (its interpreter does not), so both returns would be typed.
    rows = idx.to(tl.int64)[:, None] * s_row
    if FP4:
        kb = k0 // 2 + tl.arange(0, BK // 2)
        byte = tl.load(base + rows + kb[None, :] * s_col, mask=mask[:, None], other=0)
        lo = decode_e2m1_to_e4m3(byte, False)
        hi = decode_e2m1_to_e4m3(byte, True)
        values = tl.reshape(tl.join(lo, hi), (idx.shape[0], BK))
    else:
        kk = k0 + tl.arange(0, BK)
        values = tl.load(base + rows + kk[None, :] * s_col, mask=mask[:, None], other=0.0)
    return values


@triton.jit
def _cast_rows(base, idx, mask, k0, s_row, s_col, UE8M0: tl.constexpr, BK: tl.constexpr):
    """(E4M3 ``[len(idx), BK]``, FP32 scale per row) of high-precision rows ``idx``, columns ``[k0, k0 + BK)``: one
    1 x ``BK`` block of ``quantize_fp8`` (a row holding NaN gets a NaN scale; masked rows scale 1)."""
    kk = k0 + tl.arange(0, BK)
    v = tl.load(base + idx.to(tl.int64)[:, None] * s_row + kk[None, :] * s_col, mask=mask[:, None], other=0.0)
    codes, sf = cast_rows_e4m3(v.to(tl.float32), UE8M0)
    return codes.to(tl.float8e4nv, bitcast=True), tl.where(mask, sf, 1.0)


@triton.jit
def _load_scale(base, idx, mask, kblock, s_row, s_col, GMN: tl.constexpr, UE8M0: tl.constexpr):
    """FP32 scales of rows ``idx`` (rows ``idx // GMN`` of the scale tensor) for K block ``kblock``; 1 where masked."""
    return load_scales(base + (idx // GMN).to(tl.int64) * s_row + kblock * s_col, mask, UE8M0)


@triton.jit
def _scaled_gemm_kernel(
    a,
    sa,
    b,
    sb,
    c,
    out,
    rows_map,
    tiles,
    num_tiles,
    N,
    K,
    s_ag,
    s_am,
    s_ak,
    s_sag,
    s_sam,
    s_sak,
    s_bg,
    s_bn,
    s_bk,
    s_sbg,
    s_sbn,
    s_sbk,
    s_cg,
    s_cm,
    s_cn,
    s_og,
    s_om,
    s_on,
    alpha,
    GMN_A: tl.constexpr,
    GK_A: tl.constexpr,
    GMN_B: tl.constexpr,
    GK_B: tl.constexpr,
    A_FP4: tl.constexpr,
    QUANT_A: tl.constexpr,
    QA_UE8M0: tl.constexpr,
    B_FP4: tl.constexpr,
    SA_UE8M0: tl.constexpr,
    SB_UE8M0: tl.constexpr,
    HAS_C: tl.constexpr,
    ROW_MAP: tl.constexpr,
    OUT_BF16: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    g, r0, r1 = tile_of(tiles, num_tiles)
    if r1 > r0:
        row, m_mask = tile_rows(rows_map, r0, r1, ROW_MAP, BM)
        n_idx = tl.program_id(1) * BN + tl.arange(0, BN)
        n_mask = n_idx < N
        a_base, sa_base = a + g * s_ag, sa + g * s_sag
        b_base, sb_base = b + g * s_bg, sb + g * s_sbg
        mask2 = m_mask[:, None] & n_mask[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            if QUANT_A:
                a_t, a_s = _cast_rows(a_base, row, m_mask, k0, s_am, s_ak, QA_UE8M0, BK)
            else:
                a_t = _load_operand(a_base, row, m_mask, k0, s_am, s_ak, A_FP4, BK)
                a_s = _load_scale(sa_base, row, m_mask, k0 // GK_A, s_sam, s_sak, GMN_A, SA_UE8M0)
            b_t = _load_operand(b_base, n_idx, n_mask, k0, s_bn, s_bk, B_FP4, BK)
            b_s = _load_scale(sb_base, n_idx, n_mask, k0 // GK_B, s_sbn, s_sbk, GMN_B, SB_UE8M0)
            s, regular = scale_product(a_s, b_s)
            if tl.max(tl.where(mask2 & ~regular, 1, 0)) > 0:
                # Dequantize in the tile: NaN/inf/overflow where deq(a) @ deq(b) has them.
                a_d = a_t.to(tl.float32) * a_s[:, None]
                b_d = b_t.to(tl.float32) * b_s[:, None]
                acc += tl.dot(a_d, tl.trans(b_d), input_precision="ieee")
            else:
                acc += tl.dot(a_t, tl.trans(b_t)) * s
        result = alpha * acc
        if HAS_C:
            c_ptr = c + g * s_cg + row.to(tl.int64)[:, None] * s_cm + n_idx[None, :] * s_cn
            result = tl.load(c_ptr, mask=mask2, other=0.0).to(tl.float32) + result
        o_ptr = out + g * s_og + row.to(tl.int64)[:, None] * s_om + n_idx[None, :] * s_on
        store_result(o_ptr, result, mask2, OUT_BF16)


__all__ = ["BLOCK_M", "block_k", "scaled_gemm", "segment_tiles", "refusal", "tile_of", "tile_rows"]
