"""``tile_kernels.transform`` (TileKernels' Ascend era): ``apply_rotary``, in-place RoPE of a query and an optional
key over the ``rotary_embedding`` op (computed out of place, written back), with upstream's asserts."""

from __future__ import annotations

import torch

from torch_ascend_moe.ops.rope import rotary_embedding

__all__ = ["apply_rotary"]


def apply_rotary(query: torch.Tensor, cos_sin_cache: torch.Tensor, key: torch.Tensor | None = None,
                 positions: torch.Tensor | None = None, interleaved: bool = False, conjugate: bool = False,
                 seqlen_offset: int = 0) -> None:  # fmt: skip
    """Rotate ``query`` (and ``key``) in place: ``[T, heads, rot]`` with ``positions [T]``, or ``[B, S, heads, rot]``
    with ``positions [B, S]``; ``cos_sin_cache [rows, rot]`` FP32 (cos halves, then sin halves); rot 64 or 128."""
    assert query.ndim in (3, 4)
    assert isinstance(seqlen_offset, int)
    if key is not None:
        assert key.ndim == query.ndim
    assert cos_sin_cache.ndim == 2
    if positions is not None:
        assert positions.shape == tuple(query.shape[:-2])
        assert positions.dtype in (torch.int32, torch.int64) and positions.stride(-1) == 1
    rot = cos_sin_cache.shape[1]
    assert rot in (64, 128)
    assert query.shape[-1] == rot and query.stride(-1) == 1
    assert query.dtype in (torch.bfloat16, torch.float32)
    assert cos_sin_cache.dtype == torch.float32 and cos_sin_cache.stride(1) == 1
    if key is not None:
        assert key.shape[-1] == rot and key.dtype == query.dtype and key.stride(-1) == 1
    for x in (query, key):
        if x is not None and x.numel():
            x.copy_(rotary_embedding(x, cos_sin_cache, positions, seqlen_offset=seqlen_offset,
                                     interleaved=interleaved, conjugate=conjugate))  # fmt: skip
