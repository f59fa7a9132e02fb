"""FLOP formulas of the sparse_mla family (FlashMLA's model, every position counted as valid: the formula sees
shapes, not which indices are valid): ``2 * tokens * topk * h_q * (d_qk + d_v)``."""

from __future__ import annotations

from torch_ascend_moe._registry import flop_formula


@flop_formula
def sparse_mla_prefill(q_shape, kv_shape, indices_shape, sm_scale, d_v, *args, out_shape=None, **kwargs) -> int:
    s_q, h_q, d_qk = q_shape
    return 2 * s_q * indices_shape[2] * h_q * (d_qk + d_v)


@flop_formula
def sparse_mla_decode(
    q_shape, k_cache_shape, indices_shape, sm_scale, d_v, attn_sink_shape=None, topk_length_shape=None,
    extra_k_cache_shape=None, extra_indices_shape=None, *args, out_shape=None, **kwargs,
) -> int:  # fmt: skip
    b, s_q, h_q, d_qk = q_shape
    topk = indices_shape[2] + (extra_indices_shape[2] if extra_indices_shape is not None else 0)
    return 2 * b * s_q * topk * h_q * (d_qk + d_v)
