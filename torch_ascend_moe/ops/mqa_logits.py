"""The mqa_logits family: DeepSeek's sparse-attention indexer (ragged prefill, paged decode, top-k)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_mqa_logits = torch.ops.ascend_moe.mqa_logits.default
_paged = torch.ops.ascend_moe.paged_mqa_logits.default
_metadata = torch.ops.ascend_moe.paged_mqa_logits_metadata.default
_topk = torch.ops.ascend_moe.mqa_topk.default
_fused = torch.ops.ascend_moe.mqa_logits_topk.default
_sparse = torch.ops.ascend_moe.sparse_mqa_logits.default
_paged_sparse = torch.ops.ascend_moe.paged_sparse_mqa_logits.default


@schema_defaults
def mqa_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    *,
    q_sf: torch.Tensor | None = None,
    k_sf: torch.Tensor | None = None,
    max_seqlen_k: int = FROM_SCHEMA,
    logits_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``logits[i, j] = sum_h weights[i, h] * relu(q[i, h] . k[j])`` for ``ks[i] <= j < ke[i]``, ``-inf`` elsewhere.

    ``q [S, H, D]`` and ``k [S_kv, D]``: BF16/FP32/FP64, or FP8 E4M3 / packed FP4 (uint8 ``[.., D/2]``) with
    FP32 or E8M0 scales ``q_sf [S, H, D/g]``, ``k_sf [S_kv, D/g]`` (one per ``1 x g`` block; FP8 ``q`` may
    omit them). ``weights [S, H]`` FP32 or BF16 (FP64 with FP64 operands); the logits take the weights'
    dtype unless ``logits_dtype`` says otherwise (BF16 weights need BF16 logits). ``ks``/``ke [S]`` int32 or
    int64 absolute KV positions. ``max_seqlen_k > 0`` returns the compressed ``[S, max_seqlen_k]`` layout:
    column ``t`` holds KV position ``ks[i] + t``. Differentiable w.r.t. float ``q``, ``k`` and ``weights``.

    >>> q, k = torch.randn(4, 8, 64), torch.randn(16, 64)
    >>> ks, ke = torch.zeros(4, dtype=torch.int32), torch.arange(13, 17, dtype=torch.int32)
    >>> mqa_logits(q, k, torch.rand(4, 8), ks, ke).shape
    torch.Size([4, 16])
    """
    return _mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype)


@schema_defaults
def paged_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    max_context_len: int,
    *,
    q_sf: torch.Tensor | None = None,
    indices: torch.Tensor | None = None,
    ascend_kv_layout: bool = FROM_SCHEMA,
    logits_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Decode logits over a paged KV cache: ``[B * next_n, max_context_len]``, row ``b * next_n + t`` scoring
    the first ``context_lens[b, t]`` tokens of request ``b`` (``-inf`` after them).

    ``q [B, next_n, H, D]`` as in ``mqa_logits``. ``kv_cache`` uint8 ``[num_blocks, block_kv, 1, bytes]``, each
    block holding ``block_kv`` token rows of FP8 (``D`` bytes) or FP4 (``D/2``) data followed by their scales:
    DeepGEMM's layout (4 bytes per token: one FP32 scale for FP8, four UE8M0 codes for FP4) or with
    ``ascend_kv_layout`` DeepGEMM-Ascend's (``D/32`` UE8M0 codes per token). Logical block ``p`` of request
    ``b`` is physical block ``block_table[b, p]``. ``indices [B]`` marks varlen runs (``next_n == 1``).
    """
    return _paged(
        q, q_sf, kv_cache, weights, context_lens, block_table, max_context_len, indices, ascend_kv_layout, logits_dtype
    )


def paged_mqa_logits_metadata(
    context_lens: torch.Tensor, block_kv: int, num_sms: int, indices: torch.Tensor | None = None
) -> torch.Tensor:
    """The paged kernel's schedule, int32 ``[num_sms + 1, 2]``: per SM the (request, 256-token KV split) it
    starts at, work split evenly. The CPU and portable kernels do not need it."""
    return _metadata(context_lens, block_kv, num_sms, indices)


@schema_defaults
def mqa_topk(
    logits: torch.Tensor, ks: torch.Tensor, ke: torch.Tensor, topk: int, *, compressed: bool = FROM_SCHEMA
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per query, the ``topk`` KV positions in ``[ks, ke)`` with the largest logits (ties to the lower position),
    ordered like ``torch.topk``: ``(values [S, topk], indices int32 [S, topk])``, padded with -inf / -1 when
    fewer positions are valid. ``values`` is differentiable (its gradient lands on the selected logits).

    ``compressed``: ``logits`` is ``mqa_logits``'s compressed layout (column ``t`` is position ``ks + t``);
    the indices are absolute KV positions either way. For paged logits pass ``ks = 0`` and
    ``ke = context_lens.flatten()``.
    """
    return _topk(logits, ks, ke, topk, compressed)


@schema_defaults
def mqa_logits_topk(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    topk: int,
    *,
    q_sf: torch.Tensor | None = None,
    k_sf: torch.Tensor | None = None,
    logits_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mqa_topk(mqa_logits(q, k, weights, ks, ke, ...), ks, ke, topk)`` in one op, never holding the ``[S, S_kv]``
    logits: ``(values [S, topk] in the logits dtype, indices int32 [S, topk])``, -inf / -1 padded, ties to the
    lower position (ranked on the values rounded to the logits dtype, as ``mqa_topk`` ranks ``mqa_logits``' output).
    Operands and dtypes as ``mqa_logits``; ``values`` is differentiable w.r.t. float ``q``, ``k`` and ``weights``
    (recomputed on the selected keys only). On Ascend it maps onto ``npu_lightning_indexer``.

    >>> q, k = torch.randn(4, 8, 64), torch.randn(16, 64)
    >>> ks, ke = torch.zeros(4, dtype=torch.int32), torch.arange(13, 17, dtype=torch.int32)
    >>> values, indices = mqa_logits_topk(q, k, torch.rand(4, 8), ks, ke, 2)
    >>> indices.shape, indices.dtype
    (torch.Size([4, 2]), torch.int32)
    """
    return _fused(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype)


@schema_defaults
def sparse_mqa_logits(
    q: torch.Tensor,
    k: torch.Tensor,
    weights: torch.Tensor,
    ks: torch.Tensor,
    ke: torch.Tensor,
    block_indices: torch.Tensor,
    sparse_block_kv: int,
    *,
    q_sf: torch.Tensor | None = None,
    k_sf: torch.Tensor | None = None,
    unaligned_ks: bool = FROM_SCHEMA,
    logits_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The indexer's logits on candidate KV blocks only (DeepSeek V4.1's hierarchical sparse indexer, DeepGEMM 2.8's
    ``fp8_fp4_sparse_mqa_logits``): ``[S, num_blocks * sparse_block_kv]``.

    ``block_indices [S, num_blocks]`` int32 holds each query's candidate blocks of ``sparse_block_kv`` (SBK) KV
    tokens: block ``b`` is tokens ``[b * SBK, b * SBK + SBK)`` (shifted by ``ks[i] % SBK`` with ``unaligned_ks``;
    otherwise a non-empty range must start at a multiple of SBK). Only the first ``min(num_blocks, ceil((ke[i] -
    ks[i]) / SBK))`` slots are read: strictly increasing ids of blocks overlapping ``[ks[i], ke[i])``; the rest is
    padding (any value). Column ``s * SBK + o`` is ``mqa_logits``' logit of token ``start(s) + o`` when it lies in
    ``[ks[i], ke[i])``, exactly -inf otherwise. BF16 logits have the dense op's bits at the same token.
    Operands, dtypes and gradients as ``mqa_logits``.

    >>> q, k = torch.randn(2, 4, 32), torch.randn(64, 32)
    >>> ks, ke = torch.tensor([0, 16], dtype=torch.int32), torch.tensor([40, 64], dtype=torch.int32)
    >>> blocks = torch.tensor([[1, 4], [2, 7]], dtype=torch.int32)
    >>> sparse_mqa_logits(q, k, torch.rand(2, 4), ks, ke, blocks, 8).shape
    torch.Size([2, 16])
    """
    return _sparse(q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, unaligned_ks, logits_dtype)


@schema_defaults
def paged_sparse_mqa_logits(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    weights: torch.Tensor,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
    block_indices: torch.Tensor,
    sparse_block_kv: int,
    *,
    q_sf: torch.Tensor | None = None,
    ascend_kv_layout: bool = FROM_SCHEMA,
    logits_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``sparse_mqa_logits`` over ``paged_mqa_logits``' cache (DeepGEMM 2.8's ``fp8_fp4_paged_sparse_mqa_logits``):
    ``[B * next_n, num_blocks * sparse_block_kv]``. Row ``b * next_n + t`` scores candidate blocks of request ``b``'s
    first ``context_lens[b, t]`` tokens (logical token positions; ``sparse_block_kv`` divides the cache's
    ``block_kv``), ``block_indices [B * next_n, num_blocks]``. Cache layouts, ``q`` and gradients as
    ``paged_mqa_logits``."""
    return _paged_sparse(
        q,
        q_sf,
        kv_cache,
        weights,
        context_lens,
        block_table,
        block_indices,
        sparse_block_kv,
        ascend_kv_layout,
        logits_dtype,
    )
