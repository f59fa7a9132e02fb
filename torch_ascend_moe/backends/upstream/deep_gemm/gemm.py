"""``bf16_gemm`` on DeepGEMM's ``bf16_gemm_nt`` (CUDA: SM90 and SM100) and DeepGEMM-Ascend's (deepgemm_api.md §3.2,
§16.2): BF16 operands of any majors, BF16 or FP32 out with FP32 accumulation rounded once, ``c`` accumulated in place
(passed as ``d``). CUDA takes ``alpha`` 1 only; Ascend passes it through. FP16, FP32 and FP64 operands stay on the
chain's next kernels (the library is BF16 only). ``bf16_einsum`` on the CUDA build's ``einsum`` (§7).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.upstream.deep_gemm import (
    ASCEND,
    CUDA,
    accumulator,
    alpha_epilogue,
    cuda_refusal,
    real_refusal,
    tma_refusal,
)
from torch_ascend_moe.checks.fp8_gemm import einsum_plan
from torch_ascend_moe.checks.gemm import bmm_signature, einsum_signature, gemm_signature


def _refusal(a, b, c, dtype) -> str | None:
    if a.dtype != torch.bfloat16:
        return f"{a.dtype} operands (the library's GEMM is BF16)"
    if dtype not in (torch.bfloat16, torch.float32):
        return f"{dtype} output (BF16 or FP32)"
    if not (a.shape[0] and b.shape[0] and a.shape[1]):
        return "empty operands: nothing to hand the library"
    if (b.shape[0] * dtype.itemsize) % 16:
        return "N not a multiple of 16 bytes of output (TMA)"
    if any(t.stride(-1) == 1 and t.stride(-2) == 1 for t in (a, b)):
        return "an operand whose last two strides are both 1 (its major axis is ambiguous to the library)"
    return real_refusal(a, b, c) or tma_refusal(a=a, b=b)


def _takes_cuda(a, b, c, alpha, out_dtype):
    _, dtype = gemm_signature(a, b, c, out_dtype)
    why = _refusal(a, b, c, dtype)
    return first_refusal(why or ("alpha != 1 (the CUDA build takes no alpha)" if alpha != 1.0 else cuda_refusal()))


def _takes_ascend(a, b, c, alpha, out_dtype):
    _, dtype = gemm_signature(a, b, c, out_dtype)
    return first_refusal(_refusal(a, b, c, dtype))


@kernel(device="cuda", library="deep_gemm", calls="deep_gemm.bf16_gemm_nt", takes=_takes_cuda, available=CUDA.available)
def bf16_gemm(a, b, c, alpha, out_dtype):
    shape, dtype = gemm_signature(a, b, c, out_dtype)
    d = accumulator(shape, dtype, c, a.device)
    CUDA.module().bf16_gemm_nt(a, b, d, c=None if c is None else d)
    return d


@kernel(
    "bf16_gemm",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.bf16_gemm_nt (Ascend)",
    takes=_takes_ascend,
    available=ASCEND.available,
)
def bf16_gemm_ascend(a, b, c, alpha, out_dtype):
    shape, dtype = gemm_signature(a, b, c, out_dtype)
    d = accumulator(shape, dtype, c, a.device)
    ASCEND.module().bf16_gemm_nt(a, b, d, c=None if c is None else d, alpha=alpha)
    return d


_BATCHED = ("bhr,hdr->bhd", "bhd,hdr->bhr")  # DeepGEMM's BF16 batched einsums (CUDA)


def _takes_einsum(equation, a, b, c, alpha, out_dtype):
    """DeepGEMM 2.6.1 ``csrc/apis/einsum.hpp`` 23-133: ``bmk,bnk->mn`` (contiguous, M, N and K multiples of 64; BF16
    out without ``c``, or FP32 out accumulated in place) and the two batched forms (BF16 in and out, no ``c``, unit
    last strides); ``alpha`` 1."""
    shape, dtype = einsum_signature(equation, a, b, c, out_dtype)
    why = None if a.dtype == torch.bfloat16 else f"{a.dtype} operands (the library's einsum is BF16)"
    why = why or ("alpha != 1 (the CUDA build takes no alpha)" if alpha != 1.0 else None)
    why = why or ("empty operands: nothing to hand the library" if not (a.numel() and b.numel()) else None)
    why = why or cuda_refusal() or real_refusal(a, b, c)
    if why:
        return first_refusal(why)
    if equation == "bmk,bnk->mn":
        (m, k), n = a.shape[1:], b.shape[1]
        if m % 64 or n % 64 or k % 64:
            return first_refusal(f"M, N, K = {m}, {n}, {k}: bmk,bnk->mn takes multiples of 64")
        if not (a.is_contiguous() and b.is_contiguous()):
            return first_refusal("a or b not contiguous (bmk,bnk->mn)")
        if dtype == torch.bfloat16 and c is not None:
            return first_refusal("a BF16 result with c (bmk,bnk->mn accumulates in place in FP32 only)")
        return first_refusal(tma_refusal(a=a, b=b))
    if equation not in _BATCHED:
        return first_refusal(f"'{equation}' (the CUDA build has BF16 {', '.join(_BATCHED)} and bmk,bnk->mn)")
    if dtype != torch.bfloat16 or c is not None:
        return first_refusal(f"{equation} gives BF16 without c only")
    if a.stride(2) != 1 or b.stride(2) != 1:
        return first_refusal("operands whose last dim is not contiguous")
    out_row = "the output's rows not 16-byte aligned (TMA)" if (shape[2] * 2) % 16 else None
    return first_refusal(out_row or tma_refusal(a=a, b=b))


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.einsum",
    takes=_takes_einsum,
    available=CUDA.available,
)
def bf16_einsum(equation, a, b, c, alpha, out_dtype):
    shape, dtype = einsum_signature(equation, a, b, c, out_dtype)
    fp32_accumulate = equation == "bmk,bnk->mn" and dtype == torch.float32
    d = accumulator(shape, dtype, c, a.device)
    if fp32_accumulate and c is None:
        d.zero_()
    CUDA.module().einsum(equation, a, b, d, c=d if fp32_accumulate else None)
    return d


def _takes_bmm_ascend(a, b, c, alpha, out_dtype):
    _, dtype = bmm_signature(a, b, c, out_dtype)
    if not a.shape[0]:
        return first_refusal("an empty batch: nothing to hand the library")
    return first_refusal(_refusal(a[0], b[0], c, dtype) or tma_refusal(a=a, b=b))  # each batch's rules, then strides


@kernel(
    "bf16_bmm",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.bf16_bmm (Ascend)",
    takes=_takes_bmm_ascend,
    available=ASCEND.available,
)
def bf16_bmm_ascend(a, b, c, alpha, out_dtype):
    shape, dtype = bmm_signature(a, b, c, out_dtype)
    d = accumulator(shape, dtype, c, a.device)
    dg = ASCEND.module()
    dg.bf16_bmm(a, b, d, c=None if c is None else d, epilogue=alpha_epilogue(dg, alpha))
    return d


_ASCEND_EINSUM = ("bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr")  # DeepGEMM-Ascend's ``einsum`` (its bf16_bmm)


def _takes_einsum_ascend(equation, a, b, c, alpha, out_dtype):
    """DeepGEMM-Ascend's ``einsum`` (``csrc/apis/einsum.hpp``): its ``bf16_bmm`` on the three batched equations'
    permuted views, BF16 or FP32 out, ``alpha`` as its Alpha epilogue, ``c`` accumulated in place."""
    _, dtype = einsum_signature(equation, a, b, c, out_dtype)
    if equation not in _ASCEND_EINSUM:
        return first_refusal(f"'{equation}' (DeepGEMM-Ascend's einsum has {', '.join(_ASCEND_EINSUM)})")
    if a.dtype != torch.bfloat16:
        return first_refusal(f"{a.dtype} operands (the library's einsum is BF16)")
    if not (a.numel() and b.numel()):
        return first_refusal("empty operands: nothing to hand the library")
    _, _, _, perm_a, perm_b, _ = einsum_plan(equation)
    va, vb = a.permute(perm_a), b.permute(perm_b)
    return first_refusal(_refusal(va[0], vb[0], c, dtype) or tma_refusal(a=va, b=vb))  # each batch's rules


@kernel(
    "bf16_einsum",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.einsum (Ascend)",
    takes=_takes_einsum_ascend,
    available=ASCEND.available,
)
def bf16_einsum_ascend(equation, a, b, c, alpha, out_dtype):
    shape, dtype = einsum_signature(equation, a, b, c, out_dtype)
    d = accumulator(shape, dtype, c, a.device)
    dg = ASCEND.module()
    dg.einsum(equation, a, b, d, c=None if c is None else d, epilogue=alpha_epilogue(dg, alpha))
    return d
