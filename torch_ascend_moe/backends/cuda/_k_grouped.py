"""The Triton kernel behind ``k_grouped_fp8_gemm`` on CUDA (the experts' weight gradients):
``out[g] = c[g] + sum_{s in group g} deq(a)[s]^T deq(b)[s]`` with DeepGEMM's scales: each group's rows come in
blocks of ``gran_k`` (the last one ragged), and row block ``r`` of group ``g`` has scale row
``first_scale_row[g] + r`` of ``sfa [rows, M]`` and ``sfb [rows, N]`` (one per column). One program per (group,
M tile, N tile) walks its group's row blocks: one FP8 ``tl.dot`` per block (exact products, FP32 sums), scaled by
``sa[m] * sb[n]`` of the block as DeepGEMM does; a block whose scales are not finite (or whose scale product
overflows or underflows) is dequantized in the tile and multiplied in an IEEE FP32 dot instead, so NaN and
infinities land where the dequantize-then-multiply contract puts them.

Group bounds and scale rows are read on the device (no host sync): the call can be captured in a CUDA graph.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.cuda._triton import (
    device_refusal,
    launch,
    load_scales,
    scale_product,
    store_result,
    tl,
    triton,
)

BLOCK_M = 32
BLOCK_N = 32
MAX_BLOCK_K = 256


def refusal(a: torch.Tensor, gran_k: int) -> str | None:
    """Why the kernel does not take a call, or None: it needs a device it runs on and a ``gran_k`` one ``tl.dot``
    takes (a power of two in [32, MAX_BLOCK_K])."""
    if gran_k & (gran_k - 1) or not 32 <= gran_k <= MAX_BLOCK_K:
        return f"gran_k {gran_k} is not a power of two in [32, {MAX_BLOCK_K}] (one tl.dot per scale block)"
    return device_refusal(a.device)


def k_grouped(a, sfa, b, sfb, begins, ends, first_scale_row, gran_k: int, out: torch.Tensor, c=None):
    """Fill ``out [G, M, N]`` (FP32 or BF16). ``begins``/``ends``/``first_scale_row``: int64 ``[G]`` on the device."""
    groups, m, n = out.shape
    sa, sa_ue8m0 = (sfa.view(torch.uint8), True) if sfa.dtype == torch.float8_e8m0fnu else (sfa, False)
    sb, sb_ue8m0 = (sfb.view(torch.uint8), True) if sfb.dtype == torch.float8_e8m0fnu else (sfb, False)
    cc = c if c is not None else out
    grid = (groups, triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    launch(
        _k_grouped_kernel,
        grid,
        a,
        sa,
        b,
        sb,
        cc,
        out,
        begins,
        ends,
        first_scale_row,
        m,
        n,
        a.stride(0),
        a.stride(1),
        sa.stride(0),
        sa.stride(1),
        b.stride(0),
        b.stride(1),
        sb.stride(0),
        sb.stride(1),
        *cc.stride(),
        *out.stride(),
        SA_UE8M0=sa_ue8m0,
        SB_UE8M0=sb_ue8m0,
        HAS_C=c is not None,
        OUT_BF16=out.dtype == torch.bfloat16,
        BM=BLOCK_M,
        BN=BLOCK_N,
        BK=gran_k,
    )
    return out


@triton.jit
def _k_grouped_kernel(
    a,
    sa,
    b,
    sb,
    c,
    out,
    begins,
    ends,
    first_scale_row,
    M,
    N,
    s_as,
    s_am,
    s_sas,
    s_sam,
    s_bs,
    s_bn,
    s_sbs,
    s_sbn,
    s_cg,
    s_cm,
    s_cn,
    s_og,
    s_om,
    s_on,
    SA_UE8M0: tl.constexpr,
    SB_UE8M0: tl.constexpr,
    HAS_C: tl.constexpr,
    OUT_BF16: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    g = tl.program_id(0)
    m_idx = tl.program_id(1) * BM + tl.arange(0, BM)
    n_idx = tl.program_id(2) * BN + tl.arange(0, BN)
    m_ok, n_ok = m_idx < M, n_idx < N
    begin = tl.load(begins + g)
    end = tl.load(ends + g)
    scale_row = tl.load(first_scale_row + g)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for s0 in range(begin, end, BK):
        s_idx = s0 + tl.arange(0, BK)
        s_ok = s_idx < end
        rows = s_idx.to(tl.int64)[:, None]
        a_t = tl.load(
            a + rows * s_as + m_idx[None, :] * s_am, mask=s_ok[:, None] & m_ok[None, :], other=0.0
        )  # [BK, BM]
        b_t = tl.load(
            b + rows * s_bs + n_idx[None, :] * s_bn, mask=s_ok[:, None] & n_ok[None, :], other=0.0
        )  # [BK, BN]
        r = scale_row + (s0 - begin) // BK
        a_s = load_scales(sa + r * s_sas + m_idx.to(tl.int64) * s_sam, m_ok, SA_UE8M0)
        b_s = load_scales(sb + r * s_sbs + n_idx.to(tl.int64) * s_sbn, n_ok, SB_UE8M0)
        s, regular = scale_product(a_s, b_s)
        if tl.max(tl.where(m_ok[:, None] & n_ok[None, :] & ~regular, 1, 0)) > 0:
            # Rows past the group's end are zeros times the scale: keep them zeros (0 * inf would be NaN).
            a_d = tl.where(s_ok[:, None], a_t.to(tl.float32) * a_s[None, :], 0.0)
            b_d = tl.where(s_ok[:, None], b_t.to(tl.float32) * b_s[None, :], 0.0)
            acc += tl.dot(tl.trans(a_d), b_d, input_precision="ieee")
        else:
            acc += tl.dot(tl.trans(a_t), b_t) * s
    mask = m_ok[:, None] & n_ok[None, :]
    if HAS_C:
        c_ptr = c + g * s_cg + m_idx.to(tl.int64)[:, None] * s_cm + n_idx[None, :] * s_cn
        acc = tl.load(c_ptr, mask=mask, other=0.0).to(tl.float32) + acc
    o_ptr = out + g * s_og + m_idx.to(tl.int64)[:, None] * s_om + n_idx[None, :] * s_on
    store_result(o_ptr, acc, mask, OUT_BF16)


__all__ = ["k_grouped", "refusal"]
