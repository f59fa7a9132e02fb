"""FlashMLA-compatible API over ``torch.ops.ascend_moe``: code written for ``import flash_mla`` runs with
``import torch_ascend_moe.flash_mla as flash_mla`` (specs/flashmla_api.md; the current G2/G3 definitions:
natural-log lse, +inf lse for a token with no valid index).

- ``flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None)`` ->
  ``(out, max_logits, lse)``: the ``sparse_mla_prefill`` op (differentiable, compilable, exportable).
- ``flash_attn_varlen_func`` / ``flash_attn_varlen_qkvpacked_func`` / ``flash_attn_varlen_kvpacked_func``: the dense
  MHA prefill (upstream SM100-only) in torch ops, differentiable (``flash_mla.dense``).
- ``get_mla_metadata(*args, **kwargs)`` -> ``(FlashMLASchedMeta(), None)``: the lazy scheduling object of the
  current API (any argument form, the old ones included, is accepted and ignored, as upstream does).
- ``flash_mla_with_kvcache``: the sparse decode over paged FP8/FP4 caches in every record format (DeepSeek-V3.2's
  656 bytes, V4's 584 block-major, V4.1's 528 and 288 token-interleaved; the extra cache sharing the softmax) as
  the ``sparse_mla_decode`` op, and the dense decode over a BF16/FP16 paged cache (``flash_mla.dense``).

Upstream's kernels accept only their tuned shapes (``d_qk`` 512/576, ``h_q`` 64/128, ``d_v`` 512, BF16); the ops
compute every shape and dtype the op documents, so code within upstream's limits runs unchanged and code outside
them runs too. Upstream's argument asserts are kept (``AssertionError`` with its conditions).
"""

from __future__ import annotations

import dataclasses

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.flash_mla import fused_norm_rope_attn_rope_cast  # noqa: F401  (G3's submodule)
from torch_ascend_moe.flash_mla.dense import (
    dense_decode,
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

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: int | None
        extra_page_block_size: int | None
        extra_topk: int | None
        enable_batch_invariant: bool = False  # G3's

    have_initialized: bool = False
    config: Config | None = None
    tile_scheduler_metadata: torch.Tensor | None = None
    num_splits: torch.Tensor | None = None


def get_mla_metadata(*args, **kwargs) -> tuple[FlashMLASchedMeta, None]:
    """``(FlashMLASchedMeta(), None)`` for any arguments (the G0/G1 call forms included), as upstream's current API."""
    return FlashMLASchedMeta(), None


_API = "flash_mla.flash_mla_with_kvcache"


def _schedule(meta: FlashMLASchedMeta, config: FlashMLASchedMeta.Config) -> None:
    """Upstream's contract for the object: the first call records its configuration, every later call must
    repeat it (the metadata it would hold is only valid for that configuration)."""
    if not meta.have_initialized:
        meta.config, meta.have_initialized = config, True
        return
    for field in dataclasses.fields(config):
        ours, theirs = getattr(config, field.name), getattr(meta.config, field.name)
        assert ours == theirs, (
            f"{_API}: sched_meta.config.{field.name} is {theirs}, this call has {ours}: your input arguments are "
            "inconsistent with sched_meta (use one get_mla_metadata() object per step and batch shape)"
        )


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta,
    num_splits: None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool | None = None,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    enable_batch_invariant: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """FlashMLA's decode (G2's signature and G3's), ``(out [b, s_q, h_q, head_dim_v], lse [b, h_q, s_q])``:

    - with ``indices``, the sparse mode over paged FP8/FP4 caches (656 / 584 / 528 / 288-byte records, an
      ``extra_k_cache`` sharing the softmax): ``ops.sparse_mla.sparse_mla_decode``;
    - without, the dense mode over a BF16/FP16 paged cache through ``block_table`` and ``cache_seqlens``
      (``flash_mla.dense.dense_decode``; G3 dropped it).

    ``is_fp8_kvcache`` unset is True with ``indices`` (G3's default; its decode is sparse only) and False without
    (G2's). ``enable_batch_invariant`` (G3: no split-KV, so a request's result does not depend on the batch) changes
    nothing here: our kernels never split a request. ``tile_scheduler_metadata`` is ``get_mla_metadata()``'s object:
    our kernels need no schedule, but as upstream the first valid call records the call's configuration in it and a
    later call with another one fails its assert."""
    assert isinstance(tile_scheduler_metadata, FlashMLASchedMeta), (
        f"{_API}: tile_scheduler_metadata must be of type FlashMLASchedMeta (get_mla_metadata()'s first element)"
    )
    assert num_splits is None, f"{_API}: num_splits must be None (the current API)"
    if is_fp8_kvcache is None:
        is_fp8_kvcache = indices is not None
    for arg, t in (("q", q), ("k_cache", k_cache)):  # before their sizes are read into the schedule's config
        ck.check_arg(isinstance(t, torch.Tensor) and t.dim() == 4, _API, arg, "rank", 4, getattr(t, "ndim", t))
    if indices is not None:
        assert not causal, f"{_API}: causal must be False when sparse attention is enabled (indices given)"
        assert is_fp8_kvcache, f"{_API}: is_fp8_kvcache must be True when sparse attention is enabled (indices given)"
    topk = indices.shape[-1] if indices is not None else None
    config = FlashMLASchedMeta.Config(
        *q.shape[:3], k_cache.shape[1], k_cache.shape[2], causal, is_fp8_kvcache, topk,
        extra_k_cache.shape[1] if extra_k_cache is not None else None,
        extra_indices_in_kvcache.shape[-1] if extra_indices_in_kvcache is not None else None,
        bool(enable_batch_invariant),
    )  # fmt: skip
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    if indices is not None:
        _schedule(tile_scheduler_metadata, config)  # after upstream's asserts, as upstream: a failed call records none
        return sparse_mla_decode(
            q, k_cache, indices, scale, head_dim_v, attn_sink, topk_length, extra_k_cache, extra_indices_in_kvcache,
            extra_topk_length,
        )  # fmt: skip
    sparse_only = (attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length)
    assert all(t is None for t in sparse_only), (
        f"{_API}: attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length and extra_topk_length must be None "
        "when dense attention is used (indices=None)"
    )
    assert block_table is not None and cache_seqlens is not None, (
        f"{_API}: block_table and cache_seqlens must be provided when dense attention is used (indices=None)"
    )
    _schedule(tile_scheduler_metadata, config)
    return dense_decode(q, k_cache, block_table, cache_seqlens, head_dim_v, scale, causal)


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    indexer_topk: int = 0,
):
    """FlashMLA's sparse prefill: ``q [s_q, h_q, d_qk]``, ``kv [s_kv, 1, d_qk]``, ``indices [s_q, 1, topk]`` int32
    (``< 0`` or ``>= s_kv`` invalid), ``attn_sink [h_q]`` FP32, ``topk_length [s_q]`` int32 ->
    ``(out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q])`` (see ``ops.sparse_mla.sparse_mla_prefill``).

    ``indexer_topk`` (512, 1024 or 2048; FlashMLA's ``nv_dev`` branch, not its main: specs/upstream_2609.md §7.1)
    appends ``lse_indexer`` FP32 ``[s_q, h_q]``: the natural-log LSE of the scaled scores over the first
    ``indexer_topk`` entries of each token's indices only, invalid entries and positions past ``topk_length``
    excluded as in ``lse``, the sink not included, +inf for an empty set, and +inf everywhere when ``topk <
    indexer_topk`` (upstream's kernel never takes its snapshot then). Computed by the same op on those entries."""
    api = "flash_mla.flash_mla_sparse_fwd"
    ck.check_arg(
        indexer_topk in (0, 512, 1024, 2048), api, "indexer_topk", "value", "0, 512, 1024 or 2048", indexer_topk
    )
    out = sparse_mla_prefill(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    if not indexer_topk:
        return out
    if indices.shape[-1] < indexer_topk:
        return (*out, torch.full_like(out[2], float("inf")))
    first = indices[..., :indexer_topk].contiguous()
    lse_indexer = sparse_mla_prefill(q, kv, first, sm_scale, d_v, None, topk_length)[2]
    return (*out, lse_indexer.contiguous())


__all__ = [
    "FlashMLASchedMeta",
    "__version__",
    "flash_attn_varlen_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_mla_sparse_fwd",
    "flash_mla_with_kvcache",
    "fused_norm_rope_attn_rope_cast",
    "get_mla_metadata",
]
