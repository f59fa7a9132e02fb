"""Device-generic ``hc_prenorm_gemm`` with torch ops (on CUDA, the TF32 rounding of b is what TF32 tensor
cores do anyway; doing it explicitly keeps every device bit-compatible with the documented numerics)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks.hc_prenorm import hc_prenorm_signature, split_ranges
from torch_ascend_moe.quant import round_to_tf32


@portable_kernel
def hc_prenorm_gemm(a, b, num_splits):
    return products(a, b, num_splits)


def products(a, b, num_splits, tf32: bool = True):
    """``(d, sqr_sum)`` with b rounded to TF32 (the op's numerics) or, ``tf32=False``, the plain FP32 product
    (``deep_gemm.tf32_hc_prenorm_gemm`` on CPU, where torch's own GEMM has no TF32)."""
    acc = hc_prenorm_signature(a, b, num_splits)
    a_f = a.to(acc)
    b_r = round_to_tf32(b) if tf32 and acc != torch.float64 else b
    if num_splits is None:
        return a_f @ b_r.T, a_f.square().sum(-1)
    d = torch.zeros(num_splits, a.shape[0], b.shape[0], dtype=acc, device=a.device)
    sqr = torch.zeros(num_splits, a.shape[0], dtype=acc, device=a.device)
    for s, (k0, k1) in enumerate(split_ranges(a.shape[1], num_splits)):
        if k1 > k0:
            d[s] = a_f[:, k0:k1] @ b_r[:, k0:k1].T
            sqr[s] = a_f[:, k0:k1].square().sum(-1)
    return d, sqr
