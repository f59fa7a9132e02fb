"""TileKernels' numeric checks: bitwise equality, DeepGEMM's ``calc_diff``, the unbiased-rounding check, byte counts."""

from __future__ import annotations

import math

import torch

from torch_ascend_moe.testing import calc_diff, count_bytes

__all__ = ["assert_equal", "calc_diff", "check_bias", "count_bytes"]


def assert_equal(x: torch.Tensor, y: torch.Tensor, check_dtype: bool = True, check_shape: bool = True,
                 check_stride: bool = True) -> None:  # fmt: skip
    """Bitwise equality (NaN payloads and signed zeros included), plus dtype / shape / stride / device."""
    assert not check_dtype or x.dtype == y.dtype, f"Tensor dtypes are not equal: {x.dtype} vs {y.dtype}"
    assert not check_shape or x.shape == y.shape, f"Tensor shapes are not equal: {x.shape} vs {y.shape}"
    assert not check_stride or x.numel() == 0 or x.stride() == y.stride(), (
        f"Tensor strides are not equal: {x.stride()} vs {y.stride()}"
    )
    assert x.device == y.device, f"Tensor devices are not equal: {x.device} vs {y.device}"
    same = torch.equal(x.contiguous().flatten().view(torch.uint8), y.contiguous().flatten().view(torch.uint8))
    assert same, (
        f"Tensor values are not equal: {x.shape=} vs {y.shape=}, differing at {torch.nonzero(x != y)[:8].tolist()}"
    )


def check_bias(x: torch.Tensor, ref_x: torch.Tensor) -> None:
    """Rounding is unbiased: the share of values below the reference (ties counted half) is 0.5 within 10/sqrt(n)."""
    n = x.numel()
    if n == 0:
        return
    below = ((x < ref_x).sum() + (x == ref_x).sum() / 2) / n
    assert abs(float(below) - 0.5) < 10 / math.sqrt(n), f"rounding is biased: {float(below):.4f} below (n = {n})"
