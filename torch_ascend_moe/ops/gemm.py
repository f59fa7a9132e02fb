"""The gemm family: dense, batched and einsum GEMMs with FP32 accumulation.

Operands are BF16 in production; FP16, FP32 and FP64 are accepted too (FP64 accumulates in FP64, which
is what gradcheck and the references use). The output is rounded once from the accumulator.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_gemm = torch.ops.ascend_moe.bf16_gemm.default
_bmm = torch.ops.ascend_moe.bf16_bmm.default
_einsum = torch.ops.ascend_moe.bf16_einsum.default


@schema_defaults
def bf16_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    alpha: float = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``D = alpha * A @ B^T + C`` for logical ``A[M, K]``, ``B[N, K]``.

    Any majorness: pass transposed views for NN/TN/TT layouts (strides decide, nothing is copied by the
    caller). ``c`` is ``[M, N]`` of the output dtype; the output dtype is ``out_dtype``, else ``c``'s,
    else ``a``'s. Differentiable w.r.t. ``a``, ``b`` and ``c``.

    >>> a, b = torch.randn(4, 64, dtype=torch.bfloat16), torch.randn(8, 64, dtype=torch.bfloat16)
    >>> bf16_gemm(a, b, out_dtype=torch.float32).shape
    torch.Size([4, 8])
    """
    return _gemm(a, b, c, alpha, out_dtype)


@schema_defaults
def bf16_bmm(
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    alpha: float = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``D[i] = alpha * A[i] @ B[i]^T + C[i]`` for ``A[B, M, K]``, ``B[B, N, K]``; output ``[B, M, N]``.

    >>> a, b = torch.randn(2, 4, 64, dtype=torch.bfloat16), torch.randn(2, 8, 64, dtype=torch.bfloat16)
    >>> bf16_bmm(a, b).shape
    torch.Size([2, 4, 8])
    """
    return _bmm(a, b, c, alpha, out_dtype)


@schema_defaults
def bf16_einsum(
    equation: str,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    alpha: float = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """DeepGEMM's einsum contractions, ``D = alpha * einsum(equation, A, B) + C``.

    ``equation`` is one of ``'bmk,bnk->mn'`` (sum of per-slice ``A[s] @ B[s]^T``), ``'bhr,hdr->bhd'``,
    ``'bhd,hdr->bhr'`` and ``'bhd,bhr->hdr'`` (the per-head projections of MLA and their weight gradient).

    >>> a, w = torch.randn(3, 2, 16, dtype=torch.bfloat16), torch.randn(2, 8, 16, dtype=torch.bfloat16)
    >>> bf16_einsum("bhr,hdr->bhd", a, w).shape
    torch.Size([3, 2, 8])
    """
    return _einsum(equation, a, b, c, alpha, out_dtype)
