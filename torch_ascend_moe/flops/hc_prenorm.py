"""FLOP formula of ``hc_prenorm_gemm``: the GEMM's 2·M·N·K plus 2·M·K for the sum of squares."""

from __future__ import annotations

from torch_ascend_moe._registry import flop_formula


@flop_formula
def hc_prenorm_gemm(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * b_shape[0] * a_shape[1] + 2 * a_shape[0] * a_shape[1]
