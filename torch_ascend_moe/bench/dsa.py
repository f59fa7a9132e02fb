"""Benchmark cases of DeepSeek Sparse Attention's attention half (``python -m torch_ascend_moe bench dsa``): the
sparse prefill (``sparse_mla_prefill``: every token over its own top-k latent KV rows, memory O(s * topk)) against
what a model without it runs, dense ``scaled_dot_product_attention`` with the same selection as an ``[s, s]``
boolean mask (the demo's ``--indexer`` path until the DSA module lands), time and peak memory in one run.

Shapes: DeepSeek-V3.2's latent attention (d_qk 576 = 512 + 64 RoPE, d_v 512, one KV head), h_q heads, causal
selections as the indexer makes them (each token picks ``topk`` of the tokens up to itself; early tokens have
fewer, padded with -1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.sparse_mla import sparse_mla_prefill


def causal_topk(s: int, topk: int, g: torch.Generator) -> torch.Tensor:
    """``[s, 1, topk]`` int32: token i's ``min(i + 1, topk)`` distinct positions among ``0..i``, then -1."""
    scores = torch.rand(s, s, generator=g).tril_() + torch.ones(s, s).tril_()  # only the causal prefix is > 0
    picked = scores.topk(min(topk, s), dim=-1)
    idx = torch.where(picked.values > 0, picked.indices, -1).to(torch.int32)
    return torch.nn.functional.pad(idx, (0, topk - idx.shape[1]), value=-1)[:, None, :]


def _prefill(s: int, h: int, topk: int) -> Case:
    d_qk, d_v = 576, 512

    def setup():
        g = torch.Generator().manual_seed(0)
        q = (torch.randn(s, h, d_qk, generator=g) / 10).bfloat16()
        kv = (torch.randn(s, 1, d_qk, generator=g) / 10).bfloat16()
        indices = causal_topk(s, topk, g)
        scale = d_qk**-0.5

        def ours():
            return sparse_mla_prefill(q, kv, indices, scale, d_v)[0]

        def dense():
            mask = torch.zeros(s, s + 1, dtype=torch.bool)  # column s collects the -1 padding
            mask.scatter_(1, torch.where(indices[:, 0] < 0, s, indices[:, 0]).long(), True)
            k = kv.transpose(0, 1)[None]  # [1, 1, s, d_qk]
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k, k[..., :d_v], attn_mask=mask[:, :s], scale=scale, enable_gqa=True
            )
            return out[0].transpose(0, 1)

        return ours, dense

    flops = 2 * s * min(topk, s) * h * (d_qk + d_v)  # FlashMLA's model: valid positions (about s * topk here)
    return Case(
        f"sparse prefill s{s} h{h} top-{topk} (d 576/512, BF16)", flops, setup, "dense SDPA + mask", memory=True
    )


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [_prefill(256, 4, 64)]
    return [_prefill(4096, 16, 2048), _prefill(8192, 16, 2048)]
