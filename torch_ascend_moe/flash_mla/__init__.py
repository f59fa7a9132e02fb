"""FlashMLA-compatible API over ``torch.ops.ascend_moe``: code written for ``import flash_mla`` runs with
``import torch_ascend_moe.flash_mla as flash_mla`` (specs/flashmla_api.md; the current G2/G3 definitions:
natural-log lse, +inf lse for a token with no valid index).

- ``flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None)`` ->
  ``(out, max_logits, lse)``: the ``sparse_mla_prefill`` op (differentiable, compilable, exportable).
- ``flash_attn_varlen_func`` / ``flash_attn_varlen_qkvpacked_func`` / ``flash_attn_varlen_kvpacked_func``: the dense
  MHA prefill (upstream SM100-only) in torch ops, differentiable (``flash_mla.dense``).
- ``get_mla_metadata(*args, **kwargs)`` -> ``(FlashMLASchedMeta(), None)``: the lazy scheduling object of the
  current API (any argument form, the old ones included, is accepted and ignored, as upstream does).

Upstream's kernels accept only their tuned shapes (``d_qk`` 512/576, ``h_q`` 64/128, ``d_v`` 512, BF16); the ops
compute every shape and dtype the op documents, so code within upstream's limits runs unchanged and code outside
them runs too. ``flash_mla_with_kvcache`` runs the sparse mode over DeepSeek-V3.2's 656-byte FP8 records
and V4.1's 528-byte ones (``sparse_mla_decode``); not yet here (issue 20): its dense mode, V4's 584-byte records,
V4.1's FP4 records and the extra cache,
which raise ``NotImplementedError`` naming what is missing.
"""

from __future__ import annotations

import dataclasses

import torch

from torch_ascend_moe.flash_mla.dense import (
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from torch_ascend_moe.ops.sparse_mla import sparse_mla_decode, sparse_mla_prefill

__version__ = "1.0.0"


@dataclasses.dataclass
class FlashMLASchedMeta:
    """Upstream's per-step scheduling cache, filled by the first decode call that uses it (our kernels need no
    schedule; the object keeps upstream's fields so code that inspects or reuses it runs)."""

    have_initialized: bool = False
    config: object | None = None
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """``(FlashMLASchedMeta(), None)`` for any arguments (the G0/G1 call forms included), as upstream's current API."""
    return FlashMLASchedMeta(), None


_SCHED_FIELDS = ("b", "s_q", "h_q", "page_block_size", "h_k", "causal", "is_fp8_kvcache", "topk")


def _not_yet(what: str):
    raise NotImplementedError(f"flash_mla.flash_mla_with_kvcache: {what} is not implemented yet (torch_ascend_moe)")


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata,
    num_splits: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's decode (G2 signature): with ``indices`` the sparse mode over a paged FP8 cache, ``(out [b, s_q,
    h_q, head_dim_v], lse [b, h_q, s_q])`` (see ``ops.sparse_mla.sparse_mla_decode``). ``tile_scheduler_metadata``
    is ``get_mla_metadata()``'s object: our kernels need no schedule, but as upstream the first call records the
    call's configuration in it and a later call with another one is refused (reuse it per step and batch shape)."""
    if num_splits is not None:
        raise ValueError("flash_mla.flash_mla_with_kvcache: argument 'num_splits': expected None (the current API)")
    if indices is None:
        _not_yet("the dense decode (indices=None)")
    if causal or not is_fp8_kvcache:
        raise ValueError(
            "flash_mla.flash_mla_with_kvcache: the sparse mode (indices given) needs causal=False and "
            f"is_fp8_kvcache=True, got causal={causal}, is_fp8_kvcache={is_fp8_kvcache}"
        )
    if extra_k_cache is not None or extra_indices_in_kvcache is not None or extra_topk_length is not None:
        _not_yet("the extra KV cache (extra_k_cache)")
    if k_cache.dim() == 4 and k_cache.shape[-1] not in (656, 528):
        _not_yet(f"the {k_cache.shape[-1]}-byte cache records (V4's 584; V3.2's 656 and V4.1's 528 run)")
    if isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        config = dict(
            zip(
                _SCHED_FIELDS,
                (*q.shape[:3], k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache, indices.shape[-1]),
            )
        )
        if not tile_scheduler_metadata.have_initialized:
            tile_scheduler_metadata.config, tile_scheduler_metadata.have_initialized = config, True
        elif tile_scheduler_metadata.config != config:
            raise AssertionError(
                f"flash_mla.flash_mla_with_kvcache: the call's configuration {config} is inconsistent with "
                f"sched_meta's {tile_scheduler_metadata.config}: use one get_mla_metadata() object per step and "
                "batch shape"
            )
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    return sparse_mla_decode(q, k_cache, indices, scale, head_dim_v, attn_sink, topk_length)


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FlashMLA's sparse prefill: ``q [s_q, h_q, d_qk]``, ``kv [s_kv, 1, d_qk]``, ``indices [s_q, 1, topk]`` int32
    (``< 0`` or ``>= s_kv`` invalid), ``attn_sink [h_q]`` FP32, ``topk_length [s_q]`` int32 ->
    ``(out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q])`` (see ``ops.sparse_mla.sparse_mla_prefill``)."""
    return sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)


__all__ = [
    "FlashMLASchedMeta",
    "__version__",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_mla_sparse_fwd",
    "flash_mla_with_kvcache",
    "get_mla_metadata",
]
