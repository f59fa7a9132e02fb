"""FLOP formulas of the gemm family: 2 FLOPs per multiply-accumulate, as ``aten.mm``'s formula counts."""

from __future__ import annotations

import math

from torch_ascend_moe._registry import flop_formula


@flop_formula
def bf16_gemm(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    m, k = a_shape
    return 2 * m * b_shape[0] * k


@flop_formula
def bf16_bmm(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    batch, m, k = a_shape
    return 2 * batch * m * b_shape[1] * k


@flop_formula
def bf16_einsum(equation, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    # Every distinct subscript is iterated once: product of all sizes, times 2.
    sizes = dict(zip(equation[0:3], a_shape)) | dict(zip(equation[4:7], b_shape))
    return 2 * math.prod(sizes.values())
