"""The Triton kernel behind ``m_grouped_bf16_gemm_swiglu`` on CUDA: the experts' L1 grouped GEMM with its SwiGLU(-quant)
epilogue in registers, so the ``[M, 2I]`` L1 output never reaches memory.

Each program takes one M tile of one expert (``_scaled_gemm.segment_tiles``' schedule, built on the device from the
layout; a row map for the id layout) and ``BN`` output columns: two FP32 accumulators, the gate rows ``[n, n + BN)``
and the up rows ``[I + n, I + n + BN)`` of the expert's weight (``tl.dot``: BF16/FP16 products exact, FP32 sums; FP32
operands in IEEE FP32). The epilogue is the op's: each accumulator rounded to ``a``'s dtype (the L1 output the
unfused pipeline stores), gate clamped to ``<= c`` and up to ``[-c, c]`` (selects, so NaN stays NaN), ``gate / (1 +
exp(-gate)) * up`` times the row's weight in FP32, then one rounding to the output dtype, or, with ``quant_gran_k``
(``BN`` = the group, a power of two in [16, 128]), the row's amax over the group, floored at 1e-4, over 448 (rounded
up to a power of two with UE8M0) as the scale and the E4M3 codes of the scaled values (``_quant``'s integer
rounding: the C++ cast's bits for the same FP32 input).

Rows no expert owns get the epilogue of a zero L1 output, written before the launch (``prefill``). SiLU's ``exp`` is
Triton's, not ATen's: values agree with the C++ kernel to FP32 rounding, not bit for bit.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.cuda._quant import cast_rows_e4m3
from torch_ascend_moe.backends.cuda._scaled_gemm import BLOCK_M, tile_of, tile_rows
from torch_ascend_moe.backends.cuda._triton import (
    INTERPRETED,
    bf16_value,
    device_refusal,
    div_rn,
    launch,
    store_result,
    tl,
    triton,
)

BLOCK_N = 64
BLOCK_K = 32
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def refusal(a: torch.Tensor, quant_gran_k: int) -> str | None:
    """Why the kernel does not take a call, or None: it needs a device it runs on, BF16/FP16/FP32 operands, and a
    quantization group that is one tile's width (a power of two in [16, 128]) or none."""
    if a.dtype not in _DTYPES:
        return f"{a.dtype} operands (the kernel takes BF16, FP16, FP32)"
    if quant_gran_k and not (16 <= quant_gran_k <= 128 and quant_gran_k & (quant_gran_k - 1) == 0):
        return f"quant_gran_k {quant_gran_k} is not a power of two in [16, 128] (one tile's width)"
    return device_refusal(a.device, (8, 0))


def prefill(rows: int, inter: int, row_weights, quant_gran_k: int, use_ue8m0: bool, dtype, device):
    """``(out, scales)`` holding the epilogue of a zero L1 output in every row (``silu(0) * 0 * w``: zero, NaN where a
    weight is not finite); the kernel overwrites the rows some expert owns."""
    from torch_ascend_moe.ops.quant import quantize_fp8

    act = torch.zeros(rows, inter, dtype=torch.float32, device=device)
    if row_weights is not None:
        act = act * row_weights[:, None]
    if quant_gran_k:
        return quantize_fp8(act, [1, quant_gran_k], use_ue8m0=use_ue8m0)
    return act.to(dtype), torch.empty(rows, 0, dtype=torch.float32, device=device)


def swiglu_gemm(a, b, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out, scales, tiles, rows_map=None):
    """Launch over the schedule ``tiles``: writes the scheduled rows of ``out`` (and ``scales``)."""
    inter, k = b.shape[1] // 2, b.shape[2]
    bn = quant_gran_k or BLOCK_N
    num_tiles = tiles.shape[1]
    w = row_weights if row_weights is not None else out
    launch(
        _swiglu_kernel,
        (num_tiles, triton.cdiv(inter, bn)),
        a,
        b,
        w,
        out.view(torch.uint8) if quant_gran_k else out,
        scales,
        rows_map if rows_map is not None else tiles,
        tiles,
        num_tiles,
        inter,
        k,
        a.stride(0),
        a.stride(1),
        b.stride(0),
        b.stride(1),
        b.stride(2),
        w.stride(0),
        out.stride(0),
        out.stride(1),
        scales.stride(0),
        float(activation_clamp) if activation_clamp is not None else 0.0,
        HAS_W=row_weights is not None,
        HAS_CLAMP=activation_clamp is not None,
        QUANT=quant_gran_k > 0,
        UE8M0=use_ue8m0,
        ROW_MAP=rows_map is not None,
        H_BF16=a.dtype == torch.bfloat16,
        H_FP16=a.dtype == torch.float16,
        # Triton's interpreter (3.9) gets BF16/FP16 dots wrong: there the operands are widened to FP32 first (the same
        # exact products); a GPU's tensor cores take them directly.
        LOW_DOT=a.dtype != torch.float32 and not INTERPRETED,
        OUT_BF16=out.dtype == torch.bfloat16,
        BM=BLOCK_M,
        BN=bn,
        BK=BLOCK_K,
    )


@triton.jit
def _load_rows(base, idx, mask, kk, k_mask, s_row, s_col):
    ptr = base + idx.to(tl.int64)[:, None] * s_row + kk[None, :] * s_col
    return tl.load(ptr, mask=mask[:, None] & k_mask[None, :], other=0.0)


@triton.jit
def _swiglu_kernel(
    a,
    b,
    w,
    out,
    scales,
    rows_map,
    tiles,
    num_tiles,
    INTER,
    K,
    s_am,
    s_ak,
    s_bg,
    s_bn,
    s_bk,
    s_w,
    s_om,
    s_on,
    s_sm,
    clamp,
    HAS_W: tl.constexpr,
    HAS_CLAMP: tl.constexpr,
    QUANT: tl.constexpr,
    UE8M0: tl.constexpr,
    ROW_MAP: tl.constexpr,
    H_BF16: tl.constexpr,
    H_FP16: tl.constexpr,
    LOW_DOT: tl.constexpr,
    OUT_BF16: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    g, r0, r1 = tile_of(tiles, num_tiles)
    if r1 > r0:
        row, m_mask = tile_rows(rows_map, r0, r1, ROW_MAP, BM)
        n_idx = tl.program_id(1) * BN + tl.arange(0, BN)
        n_mask = n_idx < INTER
        b_base = b + g * s_bg
        acc_g = tl.zeros((BM, BN), dtype=tl.float32)
        acc_u = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + tl.arange(0, BK)
            k_mask = kk < K
            a_t = _load_rows(a, row, m_mask, kk, k_mask, s_am, s_ak)
            g_t = _load_rows(b_base, n_idx, n_mask, kk, k_mask, s_bn, s_bk)
            u_t = _load_rows(b_base, INTER + n_idx, n_mask, kk, k_mask, s_bn, s_bk)
            if LOW_DOT:  # BF16/FP16 products are exact in the FP32 accumulator
                acc_g += tl.dot(a_t, tl.trans(g_t))
                acc_u += tl.dot(a_t, tl.trans(u_t))
            else:
                a_f = a_t.to(tl.float32)
                acc_g += tl.dot(a_f, tl.trans(g_t.to(tl.float32)), input_precision="ieee")
                acc_u += tl.dot(a_f, tl.trans(u_t.to(tl.float32)), input_precision="ieee")
        # The L1 output as the unfused pipeline stores it: rounded once to a's dtype.
        if H_BF16:
            acc_g = bf16_value(acc_g)
            acc_u = bf16_value(acc_u)
        if H_FP16:
            acc_g = acc_g.to(tl.float16).to(tl.float32)
            acc_u = acc_u.to(tl.float16).to(tl.float32)
        if HAS_CLAMP:
            acc_g = tl.where(acc_g > clamp, clamp, acc_g)
            acc_u = tl.where(acc_u > clamp, clamp, tl.where(acc_u < -clamp, -clamp, acc_u))
        act = div_rn(acc_g, 1.0 + tl.exp(-acc_g)) * acc_u
        if HAS_W:
            act = act * tl.load(w + row.to(tl.int64) * s_w, mask=m_mask, other=0.0)[:, None]
        mask2 = m_mask[:, None] & n_mask[None, :]
        o_ptr = out + row.to(tl.int64)[:, None] * s_om + n_idx[None, :] * s_on
        if QUANT:
            # One scale per row of this tile (BN = the quantization group): the C++ cast's rule on the same values.
            codes, sf = cast_rows_e4m3(tl.where(mask2, act, 0.0), UE8M0)
            tl.store(o_ptr, codes, mask=mask2)
            tl.store(scales + row.to(tl.int64) * s_sm + tl.program_id(1), sf, mask=m_mask)
        else:
            store_result(o_ptr, act, mask2, OUT_BF16)


__all__ = ["BLOCK_M", "prefill", "refusal", "swiglu_gemm"]
