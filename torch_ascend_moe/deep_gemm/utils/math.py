"""Integer helpers of ``deep_gemm.utils.math`` (layout arithmetic)."""

from __future__ import annotations


def ceil_div(x: int, y: int) -> int:
    """``ceil(x / y)`` for non-negative ints. ``ceil_div(7, 4) == 2``."""
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    """``x`` rounded up to a multiple of ``y``. ``align(7, 4) == 8``."""
    return ceil_div(x, y) * y


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """``x`` elements rounded up so the row spans a multiple of 16 bytes (CUDA TMA's rule)."""
    if element_size <= 0 or 16 % element_size:
        raise ValueError(f"get_tma_aligned_size: argument 'element_size': expected a divisor of 16, got {element_size}")
    return align(x, 16 // element_size)
