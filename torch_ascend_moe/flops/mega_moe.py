"""FLOP formula of ``mega_moe``: per routed (token, slot) pair, L1 (2·H·2I) and L2 (2·I·H): 6·H·I, as upstream's
benchmark counts it (over received tokens); the fused shared experts add 6·H·I_s per token."""

from __future__ import annotations

from torch_ascend_moe._registry import flop_formula


@flop_formula
def mega_moe(
    x_shape,
    x_sf_shape,
    idx_shape,
    w_shape,
    l1_shape,
    l1_sf_shape,
    l2_shape,
    l2_sf_shape,
    shared_l1_shape=None,
    *args,
    out_shape=None,
    **kwargs,
) -> int:
    tokens, hidden = x_shape
    flops = 6 * idx_shape[0] * idx_shape[1] * hidden * (l1_shape[1] // 2)
    if shared_l1_shape is not None:
        flops += 6 * tokens * hidden * (shared_l1_shape[0] // 2)
    return flops
