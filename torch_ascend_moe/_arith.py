"""Arithmetic torch has no op for, written in torch ops so every device runs it (TileKernels' references rely on a
fused multiply-add where its kernels use one)."""

from __future__ import annotations

import torch


def fma(a: torch.Tensor, b: torch.Tensor, c) -> torch.Tensor:
    """``a * b + c`` rounded once (a fused multiply-add), for FP32 ``a``, ``b`` (``c`` a tensor or a number).

    In FP64 the product of two FP32 values is exact; the sum is rounded to odd (round to nearest, then, if that
    was inexact and landed on an even mantissa, one step toward the exact value: the error comes from TwoSum), and
    an FP64 result rounded to odd rounds to FP32 exactly as the exact value would (53 >= 24 + 2 bits). FP64
    operands take the plain expression."""
    if a.dtype == torch.float64:
        return a * b + c
    p = a.double() * b.double()
    c = torch.as_tensor(c, dtype=torch.float64, device=p.device)
    s = p + c
    bp = s - p
    err = (p - (s - bp)) + (c - bp)
    even = (s.view(torch.int64) & 1) == 0
    step = torch.nextafter(s, torch.where(err > 0, s.new_tensor(torch.inf), s.new_tensor(-torch.inf)))
    s = torch.where((err != 0) & torch.isfinite(err) & even, step, s)
    return s.float()
