"""The rope family: rotary position embedding from a cos/sin cache (TileKernels' ``transform.apply_rotary``)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_rope = torch.ops.ascend_moe.rotary_embedding.default


@schema_defaults
def rotary_embedding(
    x: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor | None = None,
    *,
    seqlen_offset: int = FROM_SCHEMA,
    interleaved: bool = FROM_SCHEMA,
    conjugate: bool = FROM_SCHEMA,
) -> torch.Tensor:
    """``x [T, heads, rot]`` or ``[B, S, heads, rot]`` rotated: per pair ``(x1·cos − x2·sin, x1·sin + x2·cos)`` with
    ``cos_sin_cache [rows, rot]`` (cos halves, then sin halves) at row ``positions + seqlen_offset`` (or the token's
    index + ``seqlen_offset``); NeoX halves, or GPT-J neighbours with ``interleaved``; ``conjugate`` rotates back.
    Computed in FP32, rounded once. Differentiable in x.

    >>> cache = torch.tensor([[0.0, 1.0]])  # cos 0, sin 1: a quarter turn
    >>> rotary_embedding(torch.tensor([[[1.0, 2.0]]]), cache).tolist()
    [[[-2.0, 1.0]]]
    """
    return _rope(x, cos_sin_cache, positions, seqlen_offset, interleaved, conjugate)
