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
them runs too. Not yet here (issue 20): ``flash_mla_with_kvcache`` (paged FP8 decode).
"""

from __future__ import annotations

import dataclasses

import torch

from torch_ascend_moe.flash_mla.dense import (
    flash_attn_varlen_func,
    flash_attn_varlen_kvpacked_func,
    flash_attn_varlen_qkvpacked_func,
)
from torch_ascend_moe.ops.sparse_mla import sparse_mla_prefill

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
    "get_mla_metadata",
]
