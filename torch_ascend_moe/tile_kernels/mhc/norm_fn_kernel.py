"""Upstream's ``tile_kernels/mhc/norm_fn_kernel.py``: its one public helper; its TileLang kernels are behind
``tile_kernels.modeling.mhc.ops.mhc_pre_norm_fn`` here."""

from __future__ import annotations

import torch

__all__ = ["round_to_tf32"]


def round_to_tf32(x: torch.Tensor) -> torch.Tensor:
    """FP32 ``x`` with 0x1000 added to its bits (upstream's rounding toward TF32: the low 13 bits, which TF32 drops,
    are left as they are)."""
    return (x.view(torch.int32) + 0x1000).view(torch.float32)
