"""A fused multiply-add on CPU tensors (the CUDA kernels contract ``a * b + c`` into one FMA; upstream's references
use a compiled ``elementwise_fma`` to match): the FP32 product is exact in FP64, the sum is rounded to odd there
(TwoSum's error decides the sticky step), and an FP64 value rounded to odd rounds to FP32 as the exact sum would."""

from __future__ import annotations

import torch


def fma(a: torch.Tensor, b, c) -> torch.Tensor:
    p = a.double() * torch.as_tensor(b, dtype=torch.float64)
    c = torch.as_tensor(c, dtype=torch.float64)
    s = p + c
    v = s - p
    err = (p - (s - v)) + (c - v)
    toward = torch.where(err > 0, torch.full_like(s, torch.inf), torch.full_like(s, -torch.inf))
    odd = torch.where(
        (err != 0) & torch.isfinite(err) & ((s.view(torch.int64) & 1) == 0), torch.nextafter(s, toward), s
    )
    return odd.float()
