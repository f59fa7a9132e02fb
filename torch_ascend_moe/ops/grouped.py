"""The grouped family: MoE grouped GEMMs over expert segments (m-grouped contiguous and masked, k-grouped).

Layouts: ``psum=True`` takes int32 cumulative group ends ``[G]`` (``torch._grouped_mm``'s ``offs``; group g
spans rows ``[align(end[g-1], alignment), end[g])``), ``psum=False`` one int32 group id per row (``-1`` =
padding). Rows outside every group are zeros in the output. Operands as in the gemm family (BF16 in
production; FP16/FP32/FP64 accepted), accumulation in FP32 and one rounding.
"""

from __future__ import annotations

import torch

_m_grouped = torch.ops.ascend_moe.m_grouped_bf16_gemm.default
_masked = torch.ops.ascend_moe.m_grouped_bf16_gemm_masked.default
_k_grouped = torch.ops.ascend_moe.k_grouped_bf16_gemm.default


def m_grouped_bf16_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    layout: torch.Tensor,
    *,
    psum: bool = True,
    alignment: int = 1,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``D[i] = A[i] @ B[g(i)]^T``: tokens ``a[M, K]`` sorted by expert, expert weights ``b[G, N, K]``.

    >>> a, b = torch.randn(5, 8), torch.randn(2, 3, 8)
    >>> m_grouped_bf16_gemm(a, b, torch.tensor([2, 5], dtype=torch.int32)).shape  # rows 0-1: expert 0
    torch.Size([5, 3])
    """
    return _m_grouped(a, b, layout, psum, alignment, out_dtype)


def m_grouped_bf16_gemm_masked(
    a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor, *, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``D[g, i] = A[g, i] @ B[g]^T`` for ``i < masked_m[g]`` (``a[G, M_max, K]``); other rows are zeros
    and the rows of ``a`` beyond ``masked_m[g]`` are never read."""
    return _masked(a, b, masked_m, out_dtype)


def k_grouped_bf16_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    layout: torch.Tensor,
    num_groups: int,
    c: torch.Tensor | None = None,
    *,
    psum: bool = True,
    alignment: int = 1,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``D[g] = C[g] + sum over rows s of group g of A[s]^T B[s]``: ``a[S, M]``, ``b[S, N]`` -> ``D[G, M, N]``.

    This is an expert weight gradient: ``a`` = output gradients, ``b`` = inputs, rows grouped by expert.
    """
    return _k_grouped(a, b, layout, num_groups, psum, alignment, c, out_dtype)
