"""FLOP formulas of the fp8_linear family: 2·M·N·K of the GEMM (the casts are not counted)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import flop_formula_for


def fp8_linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * x_shape[0] * w_shape[0] * x_shape[1]


flop_formula_for([torch.ops.ascend_moe.fp8_quant_gemm, torch.ops.ascend_moe.fp8_linear], fp8_linear_flops)
