"""``deep_gemm.testing.numeric``: DeepGEMM's comparison helpers (``calc_diff`` and ``count_bytes`` are
``torch_ascend_moe.testing``'s)."""

from __future__ import annotations

import torch

from torch_ascend_moe.testing import calc_diff, count_bytes

__all__ = ["assert_bitwise_equal", "calc_diff", "count_bytes"]


def assert_bitwise_equal(x: torch.Tensor, y: torch.Tensor, label: str = "") -> None:
    """Raise AssertionError naming the first differing element unless ``x`` and ``y`` match byte for byte."""
    if x.shape != y.shape or x.dtype != y.dtype:
        raise AssertionError(f"{label}: {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}")
    xb = x.contiguous().view(torch.uint8).flatten()
    yb = y.contiguous().view(torch.uint8).flatten()
    diff = (xb != yb).nonzero()
    if diff.numel():
        first = int(diff[0]) // x.element_size()
        raise AssertionError(
            f"{label}: {diff.numel()} bytes differ; first at element {first}: "
            f"{x.flatten()[first].item()} vs {y.flatten()[first].item()}"
        )
