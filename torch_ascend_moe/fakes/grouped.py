"""Fakes of the grouped family; the checks and output shapes are ``torch_ascend_moe/checks/grouped.py``."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.grouped import (
    k_grouped_fp8_signature,
    k_grouped_signature,
    m_grouped_fp8_linear_signature,
    m_grouped_fp8_quant_signature,
    m_grouped_fp8_signature,
    m_grouped_signature,
    masked_fp8_signature,
    masked_signature,
    swiglu_fp8_signature,
    swiglu_signature,
)


@fake
def m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype):
    shape, dtype = m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
    return a.new_empty(shape, dtype=dtype)


@fake
def m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype):
    shape, dtype = masked_signature(a, b, masked_m, out_dtype)
    return a.new_empty(shape, dtype=dtype)


@fake
def k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    shape, dtype = k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    return a.new_empty(shape, dtype=dtype)


@fake
def m_grouped_fp8_gemm(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    shape, dtype = m_grouped_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)
    return a.new_empty(shape, dtype=dtype)


@fake
def m_grouped_fp8_gemm_masked(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
    shape, dtype = masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
    return a.new_empty(shape, dtype=dtype)


@fake
def m_grouped_fp8_linear(x, weight, layout, psum, alignment, block, use_ue8m0, fp8_backward):
    return x.new_empty(m_grouped_fp8_linear_signature(x, weight, layout, psum, alignment, block))


@fake
def m_grouped_fp8_quant_gemm(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, use_ue8m0, out_dtype):
    shape, dtype = m_grouped_fp8_quant_signature(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, out_dtype)
    return x.new_empty(shape, dtype=dtype)


@fake
def k_grouped_fp8_gemm(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype):
    shape, dtype = k_grouped_fp8_signature(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype)
    return a.new_empty(shape, dtype=dtype)


@fake
def m_grouped_bf16_gemm_swiglu(
    a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype
):
    shape, sf_shape, dtype = swiglu_signature(
        a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype
    )
    return a.new_empty(shape, dtype=dtype), a.new_empty(sf_shape, dtype=torch.float32)


@fake
def m_grouped_fp8_gemm_swiglu(
    a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, row_weights, activation_clamp, quant_gran_k,
    use_ue8m0, out_dtype,
):  # fmt: skip
    shape, sf_shape, dtype = swiglu_fp8_signature(
        a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, row_weights, activation_clamp, quant_gran_k,
        use_ue8m0, out_dtype,
    )  # fmt: skip
    return a.new_empty(shape, dtype=dtype), a.new_empty(sf_shape, dtype=torch.float32)
