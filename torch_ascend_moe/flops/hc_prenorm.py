"""FLOP formula of ``hc_prenorm_gemm``: the GEMM's 2·M·N·K plus 2·M·K for the sum of squares."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula


@register_flop_formula(torch.ops.ascend_moe.hc_prenorm_gemm)
def hc_prenorm_flops(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return 2 * a_shape[0] * b_shape[0] * a_shape[1] + 2 * a_shape[0] * a_shape[1]
