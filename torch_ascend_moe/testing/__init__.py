"""What a user or a third-party backend needs to test ops: DeepGEMM's ``calc_diff`` and ``count_bytes`` (here),
model-level fp64 references (``testing.references``), the op-contract harness (``testing.harness``: ``OpSpec``,
``SampleInput``, ``BadInput``, the checks) and the bad-input campaign's mechanism (``testing.campaign``).

This project's own specs (samples, fp64 references, bad inputs of every op) live with its tests, in
``tests/<family>/specs.py`` of a source checkout; a backend runs the harness on them or on spec modules of its own."""

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


def at_threads(threads: int, fn):
    """``fn()`` with ``torch.set_num_threads(threads)``, the previous count restored after: CPU kernels promise the same
    bits at every thread count, and tests run them at one and at two."""
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(was)


__all__ = ["at_threads", "calc_diff", "count_bytes"]
