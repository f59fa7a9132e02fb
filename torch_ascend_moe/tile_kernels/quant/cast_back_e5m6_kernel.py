"""Upstream's ``tile_kernels/quant/cast_back_e5m6_kernel.py``: ``cast_back_e5m6``, with its asserts (the
reference ``tile_kernels.torch.cast_back_from_e5m6`` computes it)."""

from __future__ import annotations

import torch

from torch_ascend_moe.tile_kernels.torch.cast_e5m6 import cast_back_from_e5m6

__all__ = ["cast_back_e5m6"]


def cast_back_e5m6(x, fmt: str, x_block_size: tuple[int, int]) -> torch.Tensor:
    """BF16 or FP32 ``[T, H]`` from the E5M6 pair ``(uint8 [T, 3H / 2], sf)``."""
    assert fmt in ("bf16", "fp32")
    data, sf = x
    assert data.dim() == 2 and sf.dim() == 2
    assert sf.dtype in (torch.int32, torch.float32)
    assert data.dtype == torch.uint8
    assert data.size(1) * 2 // 3 % 8 == 0
    return cast_back_from_e5m6(x, fmt, x_block_size)
