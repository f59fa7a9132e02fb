"""``tile_kernels.torch.engram``: upstream's Engram reference names (``make_offsets``, ``engram_hash_ref``,
``engram_gate_ref``) over ``torch_ascend_moe.ops.engram``."""

from __future__ import annotations

import torch

from torch_ascend_moe.ops import engram as ops

__all__ = ["engram_gate_ref", "engram_hash_ref", "make_offsets"]

make_offsets = ops.make_offsets


def engram_hash_ref(ngram_token_ids, multipliers, vocab_sizes, offsets) -> torch.Tensor:
    return ops.engram_hash(ngram_token_ids, multipliers, vocab_sizes, offsets)


def engram_gate_ref(hidden_states, k, v, weight_hidden, weight_embed, clamp_value: float, eps: float,
                    save_for_backward: bool = False):  # fmt: skip
    """The gate with separate weights (differentiable in all five tensors); ``save_for_backward`` also returns
    ``(raw_dot, gate_score, rstd_x, rstd_k)``. The output is BF16, as upstream's."""
    out, raw, gate, rstd_x, rstd_k = ops.engram_gate(
        hidden_states, k, v, weight_hidden.float() * weight_embed.float(), clamp_value, eps
    )
    out = out.bfloat16()
    return (out, raw, gate, rstd_x, rstd_k) if save_for_backward else out
