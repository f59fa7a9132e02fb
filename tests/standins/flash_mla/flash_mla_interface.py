"""``flash_mla/flash_mla_interface.py`` @ 9241ae3: the Python entry points (only the sparse prefill is modelled)."""

from __future__ import annotations

import torch

from . import cuda as flash_mla_cuda


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return flash_mla_cuda.sparse_prefill_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)


def _not_modelled(name):
    def call(*args, **kwargs):
        raise NotImplementedError(f"FlashMLA stand-in: {name} is not modelled")

    call.__name__ = name
    return call


get_mla_metadata = _not_modelled("get_mla_metadata")
flash_mla_with_kvcache = _not_modelled("flash_mla_with_kvcache")
flash_attn_varlen_func = _not_modelled("flash_attn_varlen_func")
flash_attn_varlen_qkvpacked_func = _not_modelled("flash_attn_varlen_qkvpacked_func")
flash_attn_varlen_kvpacked_func = _not_modelled("flash_attn_varlen_kvpacked_func")
