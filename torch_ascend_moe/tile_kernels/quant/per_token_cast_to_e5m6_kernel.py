"""Upstream's ``tile_kernels/quant/per_token_cast_to_e5m6_kernel.py``: ``per_token_cast_to_e5m6``, with its asserts
(one scale per token: the reference ``tile_kernels.torch.cast_to_e5m6`` with ``num_per_channels`` the hidden size)."""

from __future__ import annotations

import torch

from torch_ascend_moe.tile_kernels.torch.cast_e5m6 import cast_to_e5m6

__all__ = ["per_token_cast_to_e5m6"]


def per_token_cast_to_e5m6(x: torch.Tensor, num_per_channels: int, use_tma_aligned_col_major_sf: bool = False,
                           round_sf: bool = False, use_packed_ue8m0: bool = False):  # fmt: skip
    """``(uint8 [T, 3H / 2], sf)``: ``x`` (BF16 or FP32 ``[T, H]``) in E5M6 with one scale per token."""
    assert x.dtype == torch.bfloat16 or x.dtype == torch.float32
    assert x.dim() == 2
    assert num_per_channels == x.shape[1]
    return cast_to_e5m6(x, num_per_channels, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)
