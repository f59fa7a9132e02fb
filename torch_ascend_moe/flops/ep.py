"""FLOP formulas of the ep family: data movement only (the combine's additions are not counted)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import flop_formula_for


def _none(*args, out_shape=None, **kwargs) -> int:
    return 0


flop_formula_for(
    [
        torch.ops.ascend_moe.ep_dispatch_layout,
        torch.ops.ascend_moe.ep_dispatch,
        torch.ops.ascend_moe.ep_dispatch_cached,
        torch.ops.ascend_moe.ep_combine,
        torch.ops.ascend_moe.ep_expand,
        torch.ops.ascend_moe.ep_low_latency_dispatch,
        torch.ops.ascend_moe.ep_low_latency_combine,
    ],
    _none,
)
