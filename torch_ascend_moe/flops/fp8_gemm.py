"""FLOP formulas of the fp8_gemm family: 2·M·N·K (per batch), K the logical (unpacked) reduction length."""

from __future__ import annotations

import math

from torch_ascend_moe._registry import flop_formula


@flop_formula
def fp8_gemm(a_shape, sfa_shape, b_shape, sfb_shape, c_shape, recipe_a, *args, out_shape=None, **kwargs) -> int:
    # Packed FP4 halves the data's K, so take K from the scales: K = (K / gran_k) * gran_k.
    return 2 * a_shape[0] * b_shape[0] * sfa_shape[1] * recipe_a[1]


@flop_formula
def fp8_bmm(a_shape, sfa_shape, b_shape, sfb_shape, c_shape, recipe_a, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1] * sfa_shape[2] * recipe_a[1]


@flop_formula
def fp8_einsum(equation, a_shape, sfa_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    # Every letter of the equation is looped over once: the MAC count is the product of their sizes.
    sizes = dict(zip(equation[0:3], a_shape)) | dict(zip(equation[4:7], b_shape))
    return 2 * math.prod(sizes.values())
