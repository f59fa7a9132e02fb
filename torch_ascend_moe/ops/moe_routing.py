"""The moe_routing family: tokens into expert-contiguous order for the grouped GEMMs, and back."""

from __future__ import annotations

import torch

_permute = torch.ops.ascend_moe.moe_permute.default
_unpermute = torch.ops.ascend_moe.moe_unpermute.default


def moe_permute(
    x: torch.Tensor, topk_idx: torch.Tensor, num_experts: int, *, alignment: int = 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copy each token once per chosen expert into that expert's segment: ``(permuted, row_map, offs)``.

    ``permuted`` has the static capacity ``T*k + (E-1)*(alignment-1)`` rows (padding rows zero);
    ``row_map[t, j]`` is the row of ``(t, j)`` (``-1`` where ``topk_idx`` is ``-1``); ``offs`` holds the
    cumulative segment ends, i.e. the psum layout of ``m_grouped_bf16_gemm`` with the same ``alignment``.

    >>> out, row_map, offs = moe_permute(torch.randn(3, 4), torch.tensor([[1, 0], [1, -1], [0, 1]]), 2)
    >>> row_map.tolist(), offs.tolist()
    ([[2, 0], [3, -1], [1, 4]], [2, 5])
    """
    return _permute(x, topk_idx, num_experts, alignment)


def moe_unpermute(y: torch.Tensor, row_map: torch.Tensor, topk_weights: torch.Tensor | None = None) -> torch.Tensor:
    """``out[t] = sum_j topk_weights[t, j] * y[row_map[t, j]]``: the weighted combine after the experts."""
    return _unpermute(y, row_map, topk_weights)
