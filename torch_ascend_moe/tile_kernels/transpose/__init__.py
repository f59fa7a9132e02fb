"""``tile_kernels.transpose``: ``transpose`` (2-D) and ``batched_transpose`` (3-D), contiguous results, with upstream's
asserts (dims multiples of 64, last dim contiguous, row stride a multiple of 4)."""

from __future__ import annotations

import torch

__all__ = ["batched_transpose", "transpose"]


def batched_transpose(x: torch.Tensor) -> torch.Tensor:
    """``[B, M, N] -> [B, N, M]``."""
    assert x.dim() == 3
    _, rows, cols = x.shape
    assert rows % 64 == 0 and cols % 64 == 0 and x.stride(-2) % 4 == 0 and x.stride(-1) == 1
    return x.transpose(1, 2).contiguous()


def transpose(x: torch.Tensor) -> torch.Tensor:
    """``[M, N] -> [N, M]``."""
    return batched_transpose(x.unsqueeze(0)).squeeze(0)
