"""Fakes of the fp8_gemm family (``fp8_gemm``, ``fp8_bmm``, ``fp8_einsum``); the checks and output shapes are
``torch_ascend_moe/checks/fp8_gemm.py``."""

from __future__ import annotations

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.fp8_gemm import fp8_bmm_signature, fp8_einsum_signature, fp8_gemm_signature


@fake
def fp8_gemm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    return a.new_empty(shape, dtype=dtype)


@fake
def fp8_bmm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_bmm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    return a.new_empty(shape, dtype=dtype)


@fake
def fp8_einsum(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_einsum_signature(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    return a.new_empty(shape, dtype=dtype)
