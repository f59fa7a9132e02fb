"""FLOP formulas of the gemm family: 2 FLOPs per multiply-accumulate, as ``aten.mm``'s formula counts."""

from __future__ import annotations

import math

import torch
from torch.utils.flop_counter import register_flop_formula


@register_flop_formula(torch.ops.ascend_moe.bf16_gemm)
def gemm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    m, k = a_shape
    return 2 * m * b_shape[0] * k


@register_flop_formula(torch.ops.ascend_moe.bf16_bmm)
def bmm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    batch, m, k = a_shape
    return 2 * batch * m * b_shape[1] * k


@register_flop_formula(torch.ops.ascend_moe.bf16_einsum)
def einsum_flops(equation, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    # Every distinct subscript is iterated once: product of all sizes, times 2.
    sizes = dict(zip(equation[0:3], a_shape)) | dict(zip(equation[4:7], b_shape))
    return 2 * math.prod(sizes.values())
