"""FLOP formula of ``rotary_embedding``: 3 per element (two products and an add or subtract per result)."""

from __future__ import annotations

import math

from torch_ascend_moe._registry import flop_formula


@flop_formula
def rotary_embedding(x_shape, *args, out_shape=None, **kwargs) -> int:
    return 3 * math.prod(x_shape)
