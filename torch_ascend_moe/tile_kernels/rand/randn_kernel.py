"""``tile_kernels.rand.randn_kernel``: ``randn`` / ``randn_like`` (upstream draws with its own kernel on Ascend and
with ``torch.randn`` elsewhere; here always ``torch.randn``)."""

from __future__ import annotations

import torch

from torch_ascend_moe.tile_kernels.config import get_device

__all__ = ["randn", "randn_like"]


def randn(*size, dtype: torch.dtype | None = None, device=None) -> torch.Tensor:
    """Standard normal samples of shape ``size`` (sizes, or one tuple of them) on ``device`` (default: where
    upstream's tests allocate)."""
    shape = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
    return torch.randn(shape, dtype=dtype, device=device or get_device())


def randn_like(input: torch.Tensor) -> torch.Tensor:  # noqa: A002  (upstream's parameter name)
    return randn(input.shape, dtype=input.dtype, device=input.device)
