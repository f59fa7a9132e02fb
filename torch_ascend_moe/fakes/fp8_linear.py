"""Fakes of the fp8_linear family (``fp8_quant_gemm``, ``fp8_linear``); the checks and output shapes are
``torch_ascend_moe/checks/fp8_linear.py``."""

from __future__ import annotations

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.fp8_linear import fp8_linear_signature, fp8_quant_gemm_signature


@fake
def fp8_quant_gemm(x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype):
    shape, dtype = fp8_quant_gemm_signature(x, b, sfb, c, gran_k, recipe_b, out_dtype)
    return x.new_empty(shape, dtype=dtype)


@fake
def fp8_linear(x, weight, bias, block, use_ue8m0, fp8_backward):
    return x.new_empty(fp8_linear_signature(x, weight, bias, block))
