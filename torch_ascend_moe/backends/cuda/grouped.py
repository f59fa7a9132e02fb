"""CUDA kernels of the grouped family: one ``torch._grouped_mm`` (PyTorch's grouped GEMM: CUTLASS on sm90+, a
per-group loop elsewhere) per call instead of the portable kernel's host loop over expert segments, with every
layout mapped on the device, so a call makes no host sync (CUDA-graph capturable) beyond our op's value checks,
which are skipped while a graph is captured (``distributed.capture``).

Mappings (``_grouped_mm``'s groups are contiguous and, here, cover every row; its FP32 accumulation is rounded
once to BF16):

* ``m_grouped_bf16_gemm``: ``_grouped_mm(a [M, K], b.transpose(1, 2) [G, K, N], offs)`` with ``offs`` =
  ``portable.covering_psum_groups`` (psum) or the ends of the rows stably sorted by id (ids; put back in place by
  an ``index_copy``); rows no group owns are computed, then zeroed (a select: inf/NaN in padding rows cannot
  leak).
* ``m_grouped_bf16_gemm_masked``: ``_grouped_mm(a [G, M_max, K], b.transpose(1, 2))`` (3-D x 3-D, a batched
  GEMM), rows at or beyond ``masked_m[g]`` zeroed.
* ``k_grouped_bf16_gemm``: ``_grouped_mm(a.T [M, S], b [S, N], offs)`` (2-D x 2-D: groups along the reduction),
  padding rows zeroed in both operands first (0 * inf is NaN); ``c`` added in FP32 before one rounding needs an
  FP32 output, which ``_grouped_mm`` does not give (``out_dtype`` must be BF16), so calls with ``c`` are portable.

Portable, and why: GPUs before sm90 (not assumed to have the fused kernel), dtypes other than BF16 in and out
(``_grouped_mm``'s meta accepts nothing else), rows or columns whose byte strides are not multiples of 16 (its
alignment rule: K and N multiples of 8 for BF16), empty operands, and the FP8 ops (``_scaled_grouped_mm`` scales per
row / per tensor, not DeepGEMM's per-K blocks; a Triton kernel is the plan).
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import cuda_kernel
from torch_ascend_moe.backends.portable import grouped as portable
from torch_ascend_moe.distributed.capture import host_readable
from torch_ascend_moe.meta.grouped import (
    K_GROUPED,
    M_GROUPED,
    MASKED,
    k_grouped_signature,
    layout_segments,
    m_grouped_signature,
    masked_signature,
)

_ALIGN = 8  # BF16 elements in 16 bytes: _grouped_mm's stride alignment


def _aligned(*dims: int) -> bool:
    return all(d % _ALIGN == 0 and d > 0 for d in dims)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` row-major with a 16-byte aligned start (``_grouped_mm`` checks the data pointer; a view's storage
    offset can break it, a fresh allocation cannot)."""
    t = t.contiguous()
    return t if t.storage_offset() * t.element_size() % 16 == 0 else t.clone()


def _bf16(*tensors: torch.Tensor, dtype: torch.dtype) -> bool:
    """BF16 operands and output, on a device whose ``_grouped_mm`` is the fused kernel: sm90+ (CUTLASS; older GPUs
    are not assumed to have it) or CPU (torch's composite kernel, what the tests run)."""
    device = tensors[0].device
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        return False
    return dtype == torch.bfloat16 and all(t.dtype == torch.bfloat16 for t in tensors)


@cuda_kernel(calls="torch._grouped_mm")
def m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype):
    _, dtype = m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
    rows, groups = a.shape[0], b.shape[0]
    if not (_bf16(a, b, dtype=dtype) and _aligned(a.shape[1], b.shape[1]) and rows and groups):
        return portable.m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype)
    if host_readable(layout):
        layout_segments(M_GROUPED, layout, psum, alignment, rows, groups)  # our op's value errors
    x, w = _rows(a), _rows(b).transpose(1, 2)  # row-major A, column-major [G, K, N] B
    if psum:
        ends, valid = portable.covering_psum_groups(layout, alignment, rows)
        y = torch._grouped_mm(x, w, offs=ends.int())
    else:
        perm, ends, _ = portable.sorted_id_groups(layout, groups)
        y = torch.empty(rows, b.shape[1], dtype=dtype, device=a.device)
        y.index_copy_(0, perm, torch._grouped_mm(x.index_select(0, perm), w, offs=ends.int()))
        valid = layout >= 0
    return torch.where(valid.unsqueeze(1), y, 0)


@cuda_kernel(calls="torch._grouped_mm")
def m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype):
    _, dtype = masked_signature(a, b, masked_m, out_dtype)
    groups, m_max, k = a.shape
    if not (_bf16(a, b, dtype=dtype) and _aligned(k, b.shape[1]) and groups and m_max):
        return portable.m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype)
    if host_readable(masked_m):
        portable._masked_rows(MASKED, masked_m, m_max)  # our op's value errors
    y = torch._grouped_mm(_rows(a), _rows(b).transpose(1, 2))
    valid = torch.arange(m_max, device=a.device).unsqueeze(0) < masked_m.unsqueeze(1)
    return torch.where(valid.unsqueeze(2), y, 0)


@cuda_kernel(calls="torch._grouped_mm")
def k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    _, dtype = k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    rows = a.shape[0]
    usable = _bf16(a, b, dtype=dtype) and c is None and _aligned(a.shape[1], b.shape[1]) and rows and num_groups
    if not usable:
        return portable.k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    if host_readable(layout):
        layout_segments(K_GROUPED, layout, psum, alignment, rows, num_groups)  # our op's value errors
    if psum:
        ends, valid = portable.covering_psum_groups(layout, alignment, rows)
    else:
        perm, ends, valid = portable.sorted_id_groups(layout, num_groups)
        a, b = a.index_select(0, perm), b.index_select(0, perm)
    # Padding rows: zero in both operands (0 * inf would be NaN). _grouped_mm's 2-D x 2-D form groups the
    # reduction: mat_a [M, S] (a.T of a row-major copy), mat_b [S, N] row-major.
    a, b = (_rows(torch.where(valid.unsqueeze(1), t, 0)) for t in (a, b))
    return torch._grouped_mm(a.T, b, offs=ends.int())
