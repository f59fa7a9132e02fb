"""``tile_kernels.utils``: the integer and dtype-name helpers upstream's code and tests import."""

from __future__ import annotations

import torch


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


def align(a: int, b: int) -> int:
    return ceil_div(a, b) * b


def is_power_of_two(x: int) -> bool:
    return x > 0 and (x & (x - 1)) == 0


def next_power_of_two(x: int) -> int:
    return 1 << (x - 1).bit_length()


# Upstream's dtype names (int8 stands for packed E2M1).
_DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1"}


def dtype_to_str(dtype: torch.dtype) -> str:
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"Unsupported dtype: {dtype}. Only fp32, bf16, e4m3, and int8(e2m1) are supported")
    return _DTYPE_NAMES[dtype]


def str_to_dtype(fmt: str) -> torch.dtype:
    """The Ascend era's inverse of ``dtype_to_str``."""
    for dtype, name in _DTYPE_NAMES.items():
        if name == fmt:
            return dtype
    raise ValueError(f"Unsupported format: {fmt}. Only fp32, bf16, e4m3, and e2m1 are supported")
