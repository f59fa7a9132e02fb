"""Test utilities shared by every op family: DeepGEMM's ``calc_diff``, fp64 references, sample inputs and
the op-contract harness (``torch_ascend_moe.testing.harness``)."""

from __future__ import annotations

import torch


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity metric ``1 - 2*sum(x*y) / sum(x^2 + y^2)``, in fp64; 0 when both are all-zero.

    It equals ``|x - y|^2 / (|x|^2 + |y|^2)``: global and scale-free (thresholds: BF16 GEMM 1e-5).

    >>> calc_diff(torch.ones(4), torch.ones(4))
    0.0
    """
    x, y = x.detach().double(), y.detach().double()
    denominator = (x * x + y * y).sum()
    if denominator == 0:
        return 0.0
    return float(1 - 2 * (x * y).sum() / denominator)


def count_bytes(*tensors) -> int:
    """Bytes held by the given tensors (recursing into tuples/lists, skipping None), as DeepGEMM counts."""
    total = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            total += count_bytes(*t)
        elif t is not None:
            total += t.numel() * t.element_size()
    return total


__all__ = ["calc_diff", "count_bytes"]


def family_specs() -> dict:
    """``{family: its OpSpecs}`` for every module of this package that lists ``SPECS`` (imported on demand)."""
    import importlib
    import pkgutil

    specs = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(module, "SPECS"):
            specs[info.name] = list(module.SPECS)
    return specs
