"""FLOP formulas of the mqa_logits family: every (query, head, KV column) score is a D-long dot product
(2·D) plus its ReLU-weighted head sum (2), counted over the whole output (masked columns included)."""

from __future__ import annotations

from torch_ascend_moe._registry import flop_formula


@flop_formula
def mqa_logits(q_shape, q_sf_shape, k_shape, *args, out_shape=None, **kwargs) -> int:
    S, H, _ = q_shape
    return S * H * out_shape[1] * (2 * k_shape[-1] + 2)


@flop_formula
def mqa_logits_backward(grad_shape, q_shape, q_sf_shape, k_shape, *args, out_shape=None, **kwargs) -> int:
    # Two score recomputations (one per pass), dq = P k and dk = P^T q.
    S, H, _ = q_shape
    return 4 * 2 * S * H * grad_shape[1] * k_shape[-1]


@flop_formula
def paged_mqa_logits(q_shape, q_sf_shape, cache_shape, *args, out_shape=None, **kwargs) -> int:
    B, next_n, H, d = q_shape
    return B * next_n * H * out_shape[1] * (2 * d + 2)


@flop_formula
def mqa_topk(*args, out_shape=None, **kwargs) -> int:
    return 0  # comparisons only, no floating-point arithmetic


@flop_formula
def paged_mqa_logits_metadata(*args, out_shape=None, **kwargs) -> int:
    return 0  # integer bookkeeping


@flop_formula
def mqa_logits_topk(q_shape, q_sf_shape, k_shape, *args, out_shape=None, **kwargs) -> int:
    # The logits it selects from: every (query, head, KV) score, as mqa_logits with full columns.
    S, H, _ = q_shape
    return S * H * k_shape[0] * (2 * k_shape[-1] + 2)


@flop_formula
def sparse_mqa_logits(q_shape, q_sf_shape, k_shape, *args, out_shape=None, **kwargs) -> int:
    # Every (query, head, candidate column) score, as mqa_logits over num_blocks * sparse_block_kv columns.
    S, H, _ = q_shape
    return S * H * out_shape[1] * (2 * k_shape[-1] + 2)


@flop_formula
def paged_sparse_mqa_logits(q_shape, q_sf_shape, cache_shape, *args, out_shape=None, **kwargs) -> int:
    B, next_n, H, d = q_shape
    return B * next_n * H * out_shape[1] * (2 * d + 2)
