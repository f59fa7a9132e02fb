"""FLOP formula of ``fp8_gemm``: 2·M·N·K, with K the logical (unpacked) reduction length."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula


@register_flop_formula(torch.ops.ascend_moe.fp8_gemm)
def fp8_gemm_flops(
    a_shape, sfa_shape, b_shape, sfb_shape, c_shape=None, recipe_a=(1, 128), *args, out_shape=None, **kwargs
) -> int:
    # Packed FP4 halves the data's K, so take K from the scales: K = (K / gran_k) * gran_k.
    return 2 * a_shape[0] * b_shape[0] * sfa_shape[1] * recipe_a[1]
