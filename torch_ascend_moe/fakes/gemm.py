"""Fakes of the gemm family; the checks and output shapes are ``torch_ascend_moe/checks/gemm.py``."""

from __future__ import annotations

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.gemm import bmm_signature, einsum_signature, gemm_signature


@fake
def bf16_gemm(a, b, c, alpha, out_dtype):
    shape, dtype = gemm_signature(a, b, c, out_dtype)
    return a.new_empty(shape, dtype=dtype)


@fake
def bf16_bmm(a, b, c, alpha, out_dtype):
    shape, dtype = bmm_signature(a, b, c, out_dtype)
    return a.new_empty(shape, dtype=dtype)


@fake
def bf16_einsum(equation, a, b, c, alpha, out_dtype):
    shape, dtype = einsum_signature(equation, a, b, c, out_dtype)
    return a.new_empty(shape, dtype=dtype)
