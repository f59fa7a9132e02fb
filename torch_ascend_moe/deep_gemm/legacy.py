"""``deep_gemm.legacy``: upstream's A100 Triton grouped GEMMs (specs/deepgemm_api.md §15), same signatures,
computed by the grouped-family ops.

Upstream picks a tile's group from its first row and writes zeros for tiles whose first row is ``-1``;
rows are independent here, so every ``-1`` row is zero (upstream's tests compare only the other rows).
The ``a_fused``/``b_fused`` forms gather their operand's rows through an index map first (``-1`` -> a
zero row), which is the MoE dispatch expansion fused into the GEMM upstream.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.ops.grouped import k_grouped_bf16_gemm, m_grouped_bf16_gemm


def _gather_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """x[rows] with rows == -1 giving zeros."""
    valid = (rows >= 0).unsqueeze(-1)
    return torch.where(valid, x[rows.clamp(min=0).long()], 0)


def _k_ids(k_start: torch.Tensor, k_end: torch.Tensor, rows: int) -> torch.Tensor:
    """Per-row group ids of the K ranges [k_start[g], k_end[g]) (-1 outside every range)."""
    r = torch.arange(rows, device=k_start.device).unsqueeze(1)
    inside = (r >= k_start.long()) & (r < k_end.long())
    return torch.where(inside.any(dim=1), inside.int().argmax(dim=1), -1).to(torch.int32)


def m_grouped_bf16_gemm_nt_contiguous_tl(a, b, d, m_indices) -> None:
    """``d[i] = a[i] @ b[m_indices[i]]^T`` (``b[G, N, K]``, any majorness); ``-1`` rows are zero."""
    d.copy_(m_grouped_bf16_gemm(a, b, m_indices.to(torch.int32), psum=False, out_dtype=d.dtype))


def m_grouped_bf16_gemm_nn_contiguous_tl(a, b, d, m_indices) -> None:
    """As ``_nt`` with ``b[G, K, N]``."""
    m_grouped_bf16_gemm_nt_contiguous_tl(a, b.transpose(1, 2), d, m_indices)


def a_fused_m_grouped_bf16_gemm_nt_contiguous_tl(a, b, d, mappings) -> None:
    """``mappings = (m_indices[M], m_row_indices[M])``: row i of the virtual A is ``a[m_row_indices[i]]``."""
    m_indices, m_row_indices = mappings
    m_grouped_bf16_gemm_nt_contiguous_tl(_gather_rows(a, m_row_indices), b, d, m_indices)


def a_fused_m_grouped_bf16_gemm_nn_contiguous_tl(a, b, d, mappings) -> None:
    """As the ``_nt`` form with ``b[G, K, N]``."""
    a_fused_m_grouped_bf16_gemm_nt_contiguous_tl(a, b.transpose(1, 2), d, mappings)


def _k_fused(a, b, d, handle, acc: bool) -> None:
    k_indices, k_start, k_end = handle
    ids = _k_ids(k_start, k_end, b.shape[0])
    out = k_grouped_bf16_gemm(a, b, ids, k_start.shape[0], d if acc else None, psum=False, out_dtype=d.dtype)
    d.copy_(out)


def a_fused_k_grouped_bf16_gemm_tn_contiguous_tl(a, b, d, handle, acc: bool) -> None:
    """``handle = (k_indices[K], k_start[G], k_end[G])``: ``d[g] = (d[g] if acc else 0) +
    sum_{k in [k_start[g], k_end[g])} a[k_indices[k]]^T b[k]``."""
    _k_fused(_gather_rows(a, handle[0]), b, d, handle, acc)


def b_fused_k_grouped_bf16_gemm_tn_contiguous_tl(a, b, d, handle, acc: bool) -> None:
    """As the ``a_fused`` form with ``b``'s rows gathered: ``... a[k]^T b[k_indices[k]]``."""
    _k_fused(a, _gather_rows(b, handle[0]), d, handle, acc)
