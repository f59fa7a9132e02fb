"""``bf16_gemm`` on DeepGEMM's ``bf16_gemm_nt`` (CUDA: SM90 and SM100) and DeepGEMM-Ascend's (deepgemm_api.md §3.2,
§16.2): BF16 operands of any majors, BF16 or FP32 out with FP32 accumulation rounded once, ``c`` accumulated in place
(passed as ``d``). CUDA takes ``alpha`` 1 only; Ascend passes it through. FP16, FP32 and FP64 operands stay on the
chain's next kernels (the library is BF16 only).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.upstream.deep_gemm import (
    ASCEND,
    CUDA,
    accumulator,
    cuda_refusal,
    real_refusal,
    tma_refusal,
)
from torch_ascend_moe.meta.gemm import gemm_signature


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
