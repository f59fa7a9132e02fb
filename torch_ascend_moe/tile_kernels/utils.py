"""``tile_kernels.utils``: the integer helpers upstream's code and tests import."""

from __future__ import annotations


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def align(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def is_power_of_two(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0
