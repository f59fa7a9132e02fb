"""FLOP formulas of the quant family: one multiply per element (by the scale's reciprocal, or by the scale); the
per-block amax and the scale arithmetic are comparisons and a few operations per block, not counted."""

from __future__ import annotations

from torch_ascend_moe._registry import flop_formula


@flop_formula
def quantize_fp8(x_shape, *args, out_shape=None, **kwargs) -> int:
    return x_shape[0] * x_shape[1]


@flop_formula
def quantize_fp4(x_shape, *args, out_shape=None, **kwargs) -> int:
    return x_shape[0] * x_shape[1]


@flop_formula
def dequantize(data_shape, scale_shape, *args, out_shape=None, **kwargs) -> int:
    return out_shape[0] * out_shape[1]


@flop_formula
def quantize_blocks(x_shape, *args, out_shape=None, **kwargs) -> int:
    return x_shape[0] * x_shape[1]
