"""The Triton kernel behind ``hc_prenorm_gemm`` on CUDA: ``d = float(a) @ tf32(b)^T`` and ``sqr_sum = sum_k
float(a)^2`` in one pass over ``a`` (the portable kernel reads it twice and, with splits, launches two GEMMs and two
reductions per split). A program per (M block, N block, split) walks its split's 64-wide K blocks (DeepGEMM's split
rule, ``checks.hc_prenorm.split_ranges``): ``b`` rounded to TF32 in the tile (nearest, ties away from zero: the
reference's rounding), the products summed in FP32 by ``tl.dot`` (TF32 tensor cores for BF16 ``a``, whose values
and the rounded ``b`` are TF32-exact, so the products are exact; IEEE FP32 for FP32 ``a``); the N-block-0 programs
also sum the squares. Empty splits write zeros. Same values as the C++ kernel up to the FP32 summation order.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.cuda._triton import device_refusal, launch, tl, triton
from torch_ascend_moe.checks.hc_prenorm import BLOCK_K

_BLOCK_M = 64


def refusal(a: torch.Tensor) -> str | None:
    """Why the kernel does not take a call, or None (FP64: gradcheck's path, the portable kernel's FP64 sums)."""
    if a.dtype == torch.float64:
        return "FP64 operands (the kernel sums in FP32)"
    return device_refusal(a.device, (8, 0))


@triton.jit
def _round_to_tf32(x):
    bits = x.to(tl.uint32, bitcast=True)
    rounded = ((bits + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(x) < float("inf"), rounded, x)


@triton.jit
def _hc_prenorm(
    a, b, d, sqr, M, N, K, S, a_s0, a_s1, b_s0, b_s1,
    TF32: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):  # fmt: skip
    pm, pn, s = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pm * BM + tl.arange(0, BM)
    cols = pn * BN + tl.arange(0, BN)
    ks = tl.arange(0, BK)
    nb = K // BK
    first = s * (nb // S) + tl.minimum(s, nb % S)
    blocks = nb // S + tl.where(s < nb % S, 1, 0)
    acc = tl.zeros([BM, BN], dtype=tl.float32)
    sq = tl.zeros([BM], dtype=tl.float32)
    for i in range(blocks):
        k = (first + i) * BK + ks
        a_t = tl.load(a + rows[:, None].to(tl.int64) * a_s0 + k[None, :] * a_s1, mask=rows[:, None] < M, other=0.0)
        a_t = a_t.to(tl.float32)
        b_t = tl.load(b + cols[:, None].to(tl.int64) * b_s0 + k[None, :] * b_s1, mask=cols[:, None] < N, other=0.0)
        b_t = _round_to_tf32(b_t)
        if TF32:
            acc = tl.dot(a_t, tl.trans(b_t), acc, input_precision="tf32")
        else:
            acc = tl.dot(a_t, tl.trans(b_t), acc, input_precision="ieee")
        sq += tl.sum(a_t * a_t, 1)
    out = s.to(tl.int64) * M * N + rows[:, None].to(tl.int64) * N + cols[None, :]
    tl.store(d + out, acc, mask=(rows[:, None] < M) & (cols[None, :] < N))
    if pn == 0:
        tl.store(sqr + s.to(tl.int64) * M + rows, sq, mask=rows < M)


def hc_prenorm_gemm(a, b, num_splits):
    """``(d, sqr_sum)`` (FP32; with a leading split dimension when ``num_splits`` is given)."""
    m, k = a.shape
    n = b.shape[0]
    splits = 1 if num_splits is None else num_splits
    d = torch.empty(splits, m, n, dtype=torch.float32, device=a.device)
    sqr = torch.empty(splits, m, dtype=torch.float32, device=a.device)
    if m:
        bn = max(16, triton.next_power_of_2(n)) if n <= 128 else 128
        grid = (triton.cdiv(m, _BLOCK_M), triton.cdiv(n, bn), splits)
        launch(
            _hc_prenorm, grid, a, b, d, sqr, m, n, k, splits, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            TF32=a.dtype == torch.bfloat16, BM=_BLOCK_M, BN=bn, BK=BLOCK_K,
        )  # fmt: skip
    if num_splits is None:
        return d[0], sqr[0]
    return d, sqr
