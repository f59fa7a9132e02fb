"""Device-generic grouped GEMMs: one portable ``bf16_gemm`` per expert segment.

The loop is over segments read from the layout on the host (a device sync on accelerators); a device's
fused grouped kernel (``torch._grouped_mm`` on CUDA, ``npu_grouped_matmul`` on Ascend) overrides these
where one exists.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.portable.gemm import bf16_gemm
from torch_ascend_moe.meta.grouped import (
    K_GROUPED,
    M_GROUPED,
    MASKED,
    k_grouped_signature,
    layout_segments,
    m_grouped_signature,
    masked_signature,
)


def m_grouped_bf16_gemm(a, b, layout, psum=True, alignment=1, out_dtype=None):
    shape, dtype = m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
    out = torch.zeros(shape, dtype=dtype, device=a.device)
    for g, begin, end in layout_segments(M_GROUPED, layout, psum, alignment, a.shape[0], b.shape[0]):
        if end > begin:
            out[begin:end] = bf16_gemm(a[begin:end], b[g], None, 1.0, dtype)
    return out


def m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype=None):
    shape, dtype = masked_signature(a, b, masked_m, out_dtype)
    out = torch.zeros(shape, dtype=dtype, device=a.device)
    for g, m in enumerate(masked_m.tolist()):
        ok = 0 <= m <= a.shape[1]
        where = f"masked_m[{g}] = {m}"
        if not ok:
            raise ValueError(f"{MASKED}: argument 'masked_m' values: expected in [0, M_max={a.shape[1]}], got {where}")
        if m:
            out[g, :m] = bf16_gemm(a[g, :m], b[g], None, 1.0, dtype)
    return out


def k_grouped_bf16_gemm(a, b, layout, num_groups, psum=True, alignment=1, c=None, out_dtype=None):
    shape, dtype = k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    acc_t = torch.float64 if a.dtype == torch.float64 else torch.float32
    acc = c.to(acc_t, copy=True) if c is not None else torch.zeros(shape, dtype=acc_t, device=a.device)
    for g, begin, end in layout_segments(K_GROUPED, layout, psum, alignment, a.shape[0], num_groups):
        if end > begin:
            acc[g] += a[begin:end].to(acc_t).T @ b[begin:end].to(acc_t)
    return acc.to(dtype)
