"""``hc_prenorm_gemm`` on DeepGEMM's ``tf32_hc_prenorm_gemm`` (deepgemm_api.md §9; DeepGEMM 2.6.1
``csrc/apis/hyperconnection.hpp`` and its SM90/SM100 kernels): BF16 ``a`` times FP32 ``b`` on TF32 tensor cores, and
the squares of ``a`` summed, per K split with the op's split rule; ``N`` a multiple of 8 up to 32 (SM90) or 128
(SM100), K-major operands. SM100 takes no empty split (more splits than 64-wide K blocks: its accumulator would be
stored unwritten). DeepGEMM-Ascend's TileLang kernel is not used: it rounds ``b`` to HF32 (11 mantissa bits), not
the TF32 our op defines, and reduces its splits internally.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.upstream.deep_gemm import CUDA, SM90, cuda_arch, cuda_refusal, real_refusal, tma_refusal
from torch_ascend_moe.checks.hc_prenorm import BLOCK_K, hc_prenorm_signature


def _takes(a, b, num_splits):
    hc_prenorm_signature(a, b, num_splits)
    (m, k), n = a.shape, b.shape[0]
    why = None if a.dtype == torch.bfloat16 else f"{a.dtype} a (the kernel reads BF16 a)"
    why = why or ("no rows or no columns: nothing to hand the library" if not (m and n) else None) or cuda_refusal()
    if why:
        return first_refusal(why)
    limit = 32 if cuda_arch() == SM90 else 128
    if n % 8 or n > limit:
        return first_refusal(f"N = {n}: the kernel takes a multiple of 8 up to {limit}")
    if a.stride(-1) != 1 or b.stride(-1) != 1:
        return first_refusal("an MN-major operand (the kernel takes K-major a and b)")
    if cuda_arch() != SM90 and num_splits is not None and num_splits > k // BLOCK_K:
        return first_refusal(f"{num_splits} splits of {k // BLOCK_K} K blocks (an empty split on SM100)")
    return first_refusal(real_refusal(a, b) or tma_refusal(a=a, b=b))


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.tf32_hc_prenorm_gemm",
    takes=_takes,
    available=CUDA.available,
)
def hc_prenorm_gemm(a, b, num_splits):
    lead = [] if num_splits is None else [num_splits]
    d = torch.empty([*lead, a.shape[0], b.shape[0]], dtype=torch.float32, device=a.device)
    sqr_sum = torch.empty([*lead, a.shape[0]], dtype=torch.float32, device=a.device)
    CUDA.module().tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits)
    return d, sqr_sum
