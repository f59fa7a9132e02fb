"""Device-generic kernels of the gemm family (torch ops only: cuBLAS on CUDA, ACLNN on Ascend).

BF16/FP16 operands with an output of their own dtype take the vendor BLAS in that dtype, which multiplies with an FP32
accumulator and rounds once (cuBLAS, ACLNN matmul); ``native_fp32_out`` (CUDA) asks the BLAS for the FP32 accumulator
of BF16/FP16 operands; otherwise operands are upcast and multiplied in the accumulator dtype.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks.gemm import bmm_signature, einsum_signature, gemm_signature
from torch_ascend_moe.quant.encodings import row_major

_REDUCED = (torch.bfloat16, torch.float16)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _baddbmm(a, b, c, alpha, out_dtype, native_fp32_out=False):
    """``alpha * a @ b^T + c`` on 3-D operands; the one routine behind all three ops. ``native_fp32_out``: the
    device's BLAS returns the FP32 accumulator of BF16/FP16 operands (``bmm``'s ``out_dtype``: cuBLAS), used for an
    FP32 result (or an FP32 ``c``) instead of multiplying FP32 copies."""
    beta = 0.0 if c is None else 1.0
    if a.dtype in _REDUCED and out_dtype == a.dtype:
        base = c if c is not None else a.new_empty(a.shape[0], a.shape[1], b.shape[1])
        return torch.baddbmm(base, a, b.transpose(1, 2), beta=beta, alpha=alpha)
    if native_fp32_out and a.dtype in _REDUCED:
        out = torch.bmm(a, b.transpose(1, 2), out_dtype=torch.float32)  # exact products, FP32 sums
        if alpha != 1.0:
            out = out * alpha
        if c is not None:
            out = out + c.to(torch.float32)
        return out.to(out_dtype)
    acc = _acc_dtype(a.dtype)
    base = c.to(acc) if c is not None else a.new_empty(a.shape[0], a.shape[1], b.shape[1], dtype=acc)
    out = torch.baddbmm(base, a.to(acc), b.to(acc).transpose(1, 2), beta=beta, alpha=alpha)
    return out.to(out_dtype)


@portable_kernel
def bf16_gemm(a, b, c, alpha, out_dtype, *, native_fp32_out=False):
    _, dtype = gemm_signature(a, b, c, out_dtype)
    c3 = None if c is None else c.unsqueeze(0)
    out = _baddbmm(a.unsqueeze(0), b.unsqueeze(0), c3, alpha, dtype, native_fp32_out)
    return row_major(out.squeeze(0))


@portable_kernel
def bf16_bmm(a, b, c, alpha, out_dtype, *, native_fp32_out=False):
    _, dtype = bmm_signature(a, b, c, out_dtype)
    return row_major(_baddbmm(a, b, c, alpha, dtype, native_fp32_out))


@portable_kernel
def bf16_einsum(equation, a, b, c, alpha, out_dtype, *, native_fp32_out=False):
    _, dtype = einsum_signature(equation, a, b, c, out_dtype)
    if equation == "bmk,bnk->mn":
        m, n = a.shape[1], b.shape[1]
        a2 = a.permute(1, 0, 2).reshape(1, m, -1)
        b2 = b.permute(1, 0, 2).reshape(1, n, -1)
        c3 = None if c is None else c.unsqueeze(0)
        return row_major(_baddbmm(a2, b2, c3, alpha, dtype, native_fp32_out).squeeze(0))
    # Per-head equations as a batched GEMM over h, mirroring csrc/ops/gemm_cpu.cpp.
    if equation == "bhr,hdr->bhd":
        a_h, b_h, to_out = a.transpose(0, 1), b, (lambda t: t.transpose(0, 1))
    elif equation == "bhd,hdr->bhr":
        a_h, b_h, to_out = a.transpose(0, 1), b.transpose(1, 2), (lambda t: t.transpose(0, 1))
    else:  # "bhd,bhr->hdr"
        a_h, b_h, to_out = a.permute(1, 2, 0), b.permute(1, 2, 0), (lambda t: t)
    c_h = None if c is None else to_out(c)
    return row_major(to_out(_baddbmm(a_h, b_h, c_h, alpha, dtype, native_fp32_out)))
