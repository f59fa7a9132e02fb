"""Benchmark cases of DeepSeek Sparse Attention's attention half (``python -m torch_ascend_moe bench dsa``): the
sparse ops against what a model without DSA runs, time and peak memory of both in one run.

- Prefill: ``sparse_mla_prefill`` (every token over its own top-k latent KV rows, memory O(s * topk)) against dense
  ``scaled_dot_product_attention`` with the same selection as an ``[s, s]`` boolean mask (the demo's ``--indexer``
  path until the DSA module lands). Causal selections as the indexer makes them (each token picks ``topk`` of the
  tokens up to itself; early tokens have fewer, padded with -1).
- Decode: ``sparse_mla_decode`` (each of a request's ``s_q`` query tokens over ``topk`` records of its own context
  in a paged FP8 cache of DeepSeek-V3.2's 656-byte records, page 64, a random block table per request) against
  dense SDPA of the same queries over each request's whole BF16 KV (causal: with ``s_q`` 2, the first token does
  not see the last one): decode without DSA. The caches themselves (656 vs 1152 bytes per token) are built in
  setup and are not in the peaks.

Shapes: DeepSeek-V3.2's latent attention (d_qk 576 = 512 + 64 RoPE, d_v 512, one KV head), h_q query heads (128 in
V3.2's decode). Full list: prefill s 4096 and 8192 (not 16384: there the dense baseline asks for one 17 GB FP32
``[16, s, s]`` score tensor, and s 4096's 2.9 GB peak scales to about 47 GB, more than a 24 GB machine holds),
decode s 4096 and 16384, top-2048 throughout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.backends.portable.sparse_mla import encode_v32
from torch_ascend_moe.backends.portable.sparse_mla import v32_records as portable_v32_records
from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.sparse_mla import sparse_mla_decode, sparse_mla_prefill

D_QK, D_V, PAGE = 576, 512, 64


def causal_topk(s: int, topk: int, g: torch.Generator) -> torch.Tensor:
    """``[s, 1, topk]`` int32: token i's ``min(i + 1, topk)`` distinct positions among ``0..i``, then -1."""
    scores = torch.rand(s, s, generator=g).tril_() + torch.ones(s, s).tril_()  # only the causal prefix is > 0
    picked = scores.topk(min(topk, s), dim=-1)
    idx = torch.where(picked.values > 0, picked.indices, -1).to(torch.int32)
    return torch.nn.functional.pad(idx, (0, topk - idx.shape[1]), value=-1)[:, None, :]


def _prefill(s: int, h: int, topk: int) -> Case:
    d_qk, d_v = D_QK, D_V

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


def v32_records(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``values [n, 576]`` as DeepSeek-V3.2's 656-byte cache records ``[n, 656]`` uint8 (``encode_v32``: FlashMLA's
    tests' quantization), and the values the records hold, ``[n, 576]`` BF16 (exact: an E4M3 code times a power of
    two), read back as the decode op reads them."""
    records = encode_v32(values)
    return records, portable_v32_records(records[:, None, None, :], torch.arange(values.shape[0]))


def _decode(b: int, s: int, s_q: int, h: int, topk: int) -> Case:
    assert s % PAGE == 0 and topk <= s - s_q + 1, "whole pages; every query token has topk positions to pick"
    d_qk, d_v = D_QK, D_V

    def setup():
        g = torch.Generator().manual_seed(0)
        q = (torch.randn(b, s_q, h, d_qk, generator=g) / 10).bfloat16()
        kv = torch.randn(b * s, d_qk, generator=g) / 10  # each request's context
        # Paged cache: request r's token p is record table[r, p // PAGE] * PAGE + p % PAGE, blocks scattered.
        pages = s // PAGE
        table = torch.randperm(b * pages, generator=g).view(b, pages)
        position = torch.arange(s)
        record = table[:, position // PAGE] * PAGE + position % PAGE  # [b, s]
        cache = torch.empty(b * pages * PAGE, 656, dtype=torch.uint8)
        records, kv = v32_records(kv)
        cache[record.reshape(-1)] = records
        kv = kv.view(b, s, d_qk)  # dense reads the values the cache holds: both sides attend over the same K and V
        cache = cache.view(b * pages, PAGE, 1, 656)
        # Query token j is at position s - s_q + j and selects topk distinct positions among those up to itself.
        visible = torch.ones(s_q, s, dtype=torch.bool).tril_(s - s_q)
        scores = torch.rand(b, s_q, s, generator=g).masked_fill_(~visible, -1)
        chosen = scores.topk(topk, dim=-1).indices  # [b, s_q, topk] positions
        indices = record.gather(1, chosen.view(b, -1)).view(b, s_q, topk).to(torch.int32)
        scale = d_qk**-0.5
        # SDPA's CPU GQA path (enable_gqa) copies K and V out to every head (torch 2.13: 13 GB peak and 20-50 s for
        # one s 16384 request), which would time the copies. With one KV head the heads fold into query rows
        # ([b, 1, s_q * h, d_qk]: MQA, as FlashMLA's decode treats them): the same attention, which SDPA runs in
        # its flash kernel without copying K or V.
        mask = None if s_q == 1 else visible.repeat_interleave(h, dim=0)  # rows: token-major, then head
        k = kv[:, None]  # [b, 1, s, d_qk]

        def ours():
            return sparse_mla_decode(q, cache, indices, scale, d_v)[0]

        def dense():
            out = F.scaled_dot_product_attention(
                q.view(b, 1, s_q * h, d_qk), k, k[..., :d_v], attn_mask=mask, scale=scale
            )
            return out.view(b, s_q, h, d_v)

        return ours, dense

    flops = 2 * b * s_q * topk * h * (d_qk + d_v)  # FlashMLA's model: the selected records
    return Case(
        f"sparse decode b{b} s{s} s_q{s_q} h{h} top-{topk} (FP8 656 B cache, page {PAGE})",
        flops,
        setup,
        "dense SDPA (BF16 KV)",
        memory=True,
    )


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [_prefill(256, 4, 64), _decode(2, 512, 2, 16, 128)]
    return [
        _prefill(4096, 16, 2048),
        _prefill(8192, 16, 2048),
        _decode(8, 4096, 1, 128, 2048),
        _decode(8, 4096, 2, 128, 2048),
        _decode(4, 16384, 1, 128, 2048),
        _decode(4, 16384, 2, 128, 2048),
    ]
