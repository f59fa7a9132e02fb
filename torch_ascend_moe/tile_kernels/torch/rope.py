"""``tile_kernels.torch.rope`` (the Ascend era's): the rotary-embedding reference over the ``rotary_embedding`` op."""

from __future__ import annotations

import torch

from torch_ascend_moe.ops.rope import rotary_embedding

__all__ = ["rotary_embedding_ref"]


def rotary_embedding_ref(x, cos, sin, positions=None, seqlen_offsets: int = 0, interleaved: bool = False,
                         conjugate: bool = False):  # fmt: skip
    """``x [..., tokens, heads, D]`` with its first ``2 · cos.size(-1)`` channels rotated by ``cos`` / ``sin``
    ``[rows, rot/2]`` (the rest copied), out of place."""
    rot = 2 * cos.shape[-1]
    out = x.clone()
    cache = torch.cat([cos, sin], dim=-1).float()
    out[..., :rot] = rotary_embedding(
        x[..., :rot].contiguous(), cache, positions, seqlen_offset=seqlen_offsets, interleaved=interleaved,
        conjugate=conjugate,
    )  # fmt: skip
    return out
