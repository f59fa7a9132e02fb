"""FLOP formulas of the grouped family. Group sizes are data, so these count every row of the buffers
(padding included): an upper bound, exact for full layouts."""

from __future__ import annotations

from torch_ascend_moe._registry import flop_formula


@flop_formula
def m_grouped_bf16_gemm(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * b_shape[1] * a_shape[1]


@flop_formula
def m_grouped_bf16_gemm_swiglu(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * b_shape[1] * a_shape[1]  # the GEMM; the epilogue's O(M * I) is not counted


@flop_formula
def m_grouped_bf16_gemm_masked(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1] * a_shape[2]


@flop_formula
def k_grouped_bf16_gemm(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


@flop_formula
def m_grouped_fp8_gemm(
    a_shape, sfa_shape, b_shape, sfb_shape, layout_shape, psum, alignment, recipe_a, *args, out_shape=None, **kwargs
) -> int:
    # K from the scales (packed FP4 halves the data's K).
    return 2 * a_shape[0] * b_shape[1] * sfa_shape[1] * recipe_a[1]


@flop_formula
def m_grouped_fp8_gemm_masked(
    a_shape, sfa_shape, b_shape, sfb_shape, masked_shape, recipe_a, *args, out_shape=None, **kwargs
) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1] * sfa_shape[2] * recipe_a[1]


@flop_formula
def m_grouped_fp8_linear(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * x_shape[0] * w_shape[1] * x_shape[1]


@flop_formula
def m_grouped_fp8_quant_gemm(x_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * x_shape[0] * b_shape[1] * x_shape[1]  # the GEMM; the cast's O(M * K) is not counted


@flop_formula
def k_grouped_fp8_gemm(a_shape, sfa_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * a_shape[1] * b_shape[1]


@flop_formula
def m_grouped_fp8_gemm_swiglu(
    a_shape, sfa_shape, b_shape, sfb_shape, layout_shape, psum, alignment, recipe_a, *args, out_shape=None, **kwargs
) -> int:
    return 2 * a_shape[0] * b_shape[1] * sfa_shape[1] * recipe_a[1]  # the GEMM, as m_grouped_fp8_gemm's
