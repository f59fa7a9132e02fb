"""FLOP formulas of the norm family, per element: forward about 4 (square, add, two products), backward about 8."""

from __future__ import annotations

import math

from torch_ascend_moe._registry import flop_formula


@flop_formula
def rms_norm(x_shape, *args, out_shape=None, **kwargs) -> int:
    return 4 * math.prod(x_shape)


@flop_formula
def rms_norm_backward(out_grad_shape, *args, out_shape=None, **kwargs) -> int:
    return 8 * math.prod(out_grad_shape)


@flop_formula
def rms_norm_quant(x_shape, *args, out_shape=None, **kwargs) -> int:
    return 5 * math.prod(x_shape)  # the normalization and the cast's multiply
