"""FLOP formula of ``topk_select``: a selection compares, it does not compute (0 FLOPs, as ``torch.topk``)."""

from __future__ import annotations

from torch_ascend_moe._registry import flop_formula


@flop_formula
def topk_select(*args, out_shape=None, **kwargs) -> int:
    return 0
