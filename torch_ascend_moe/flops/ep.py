"""FLOP formulas of the ep family: data movement only (the combine's additions are not counted)."""

from __future__ import annotations

import torch
from torch.utils.flop_counter import register_flop_formula


def _none(*args, out_shape=None, **kwargs) -> int:
    return 0


for _op in (
    torch.ops.ascend_moe.ep_dispatch_layout,
    torch.ops.ascend_moe.ep_dispatch,
    torch.ops.ascend_moe.ep_dispatch_cached,
    torch.ops.ascend_moe.ep_combine,
    torch.ops.ascend_moe.ep_expand,
    torch.ops.ascend_moe.ep_low_latency_dispatch,
    torch.ops.ascend_moe.ep_low_latency_combine,
):
    register_flop_formula(_op)(_none)
