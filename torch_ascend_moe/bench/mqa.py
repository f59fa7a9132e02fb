"""Benchmark cases of the mqa_logits family: time and peak memory against the naive einsum formula.

The baseline is what a PyTorch implementation of the indexer writes: dequantize, form the whole
``[S, H, S_kv]`` score tensor with one einsum, ReLU, weight and sum the heads, mask with -inf (and for the
backward, autograd through that, which keeps the scores for the backward). Ours tiles queries and KV and
never holds more than a block of scores; the peak-memory columns show the difference.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import quant
from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.mqa_logits import mqa_logits, mqa_logits_topk, mqa_topk, paged_mqa_logits, sparse_mqa_logits


def _causal_ranges(s: int, s_kv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's causal-suffix pattern: ks = 0, ke[i] = i + S_kv - S."""
    ke = torch.arange(s, dtype=torch.int32) + (s_kv - s)
    return torch.zeros(s, dtype=torch.int32), ke.clamp(min=0)


def _fp8_rows(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``k [N, D]`` as FP8 with one FP32 scale per row (``[N, 1]``), upstream's KV format."""
    data, sf = quant.per_custom_dims_cast_to_fp8(k, (0,), False)
    return data, sf.view(-1, 1)


def _paged_fp8_cache(ks: list[torch.Tensor], block_kv: int):
    """(cache, block table, fp64 values per request): DeepGEMM's paged FP8 layout, each block ``block_kv`` tokens'
    E4M3 bytes followed by their FP32 scales, the requests' blocks one after another."""
    d = ks[0].shape[1]
    blocks = [-(-k.shape[0] // block_kv) for k in ks]
    cache = torch.zeros(sum(blocks), block_kv * (d + 4), dtype=torch.uint8)
    table = torch.zeros(len(ks), max(blocks), dtype=torch.int32)
    values, first = [], 0
    for b, k in enumerate(ks):
        data, sf = _fp8_rows(k)
        values.append(data.double() * sf.double())
        for p in range(blocks[b]):
            rows = slice(p * block_kv, min((p + 1) * block_kv, k.shape[0]))
            n = rows.stop - rows.start
            cache[first + p, : n * d] = data[rows].view(torch.uint8).reshape(-1)
            cache[first + p, block_kv * d : block_kv * d + n * 4] = sf[rows].view(torch.uint8).reshape(-1)
            table[b, p] = first + p
        first += blocks[b]
    return cache.view(-1, block_kv, 1, d + 4), table, values


def _naive(qd, kd, w, ks, ke):
    scores = torch.einsum("ihd,jd->ihj", qd, kd).relu()
    logits = torch.einsum("ihj,ih->ij", scores, w)
    j = torch.arange(kd.shape[0])
    return logits.masked_fill((j < ks[:, None]) | (j >= ke[:, None]), float("-inf"))


def _prefill_case(s, s_kv, h, d, fmt: str) -> Case:
    def setup():
        g = torch.Generator().manual_seed(s + s_kv)
        q, k = torch.randn(s, h, d, generator=g), torch.randn(s_kv, d, generator=g)
        w = torch.rand(s, h, generator=g)
        ks, ke = _causal_ranges(s, s_kv)
        if fmt == "bf16":
            q, k = q.bfloat16(), k.bfloat16()
            return (lambda: mqa_logits(q, k, w, ks, ke)), (lambda: _naive(q.float(), k.float(), w, ks, ke))
        q8, (k8, k_sf) = q.to(torch.float8_e4m3fn), _fp8_rows(k)

        def naive():
            return _naive(q8.float(), k8.float() * k_sf, w, ks, ke)

        return (lambda: mqa_logits(q8, k8, w, ks, ke, k_sf=k_sf)), naive

    flops = s * h * s_kv * (2 * d + 2)
    return Case(f"mqa_logits {fmt} S{s} S_kv{s_kv} H{h} D{d}", flops, setup, "naive einsum fp32", memory=True)


def _backward_case(s, s_kv, h, d) -> Case:
    def setup():
        g = torch.Generator().manual_seed(3)
        q = torch.randn(s, h, d, generator=g, requires_grad=True)
        k = torch.randn(s_kv, d, generator=g, requires_grad=True)
        w = torch.rand(s, h, generator=g, requires_grad=True)
        ks, ke = _causal_ranges(s, s_kv)
        grad = torch.randn(s, s_kv, generator=g)

        def ours():
            return torch.autograd.grad(mqa_logits(q, k, w, ks, ke), (q, k, w), grad)

        def naive():
            out = _naive(q, k, w, ks, ke)
            return torch.autograd.grad(out, (q, k, w), grad.masked_fill(out.isinf(), 0))

        return ours, naive

    flops = 3 * 2 * s * h * s_kv * d  # forward, dq, dk GEMMs (recomputation not counted)
    return Case(
        f"mqa_logits fwd+bwd fp32 S{s} S_kv{s_kv} H{h} D{d}",
        flops,
        setup,
        "naive einsum + autograd",
        memory=True,
        grad=True,
    )


def _topk_case(s, s_kv, h, d, topk) -> Case:
    """The indexer's selection: ``mqa_logits_topk`` against our own two ops (``mqa_topk(mqa_logits(...))``, which
    hold the ``[S, S_kv]`` logits): the peak-memory column is the point."""

    def setup():
        g = torch.Generator().manual_seed(7)
        q, (k8, k_sf) = torch.randn(s, h, d, generator=g).to(torch.float8_e4m3fn), _fp8_rows(torch.randn(s_kv, d))
        w = torch.rand(s, h, generator=g)
        ks, ke = _causal_ranges(s, s_kv)

        def composed():
            return mqa_topk(mqa_logits(q, k8, w, ks, ke, k_sf=k_sf), ks, ke, topk)

        return (lambda: mqa_logits_topk(q, k8, w, ks, ke, topk, k_sf=k_sf)), composed

    return Case(
        f"mqa_logits_topk fp8 S{s} S_kv{s_kv} H{h} D{d} top{topk}",
        s * h * s_kv * (2 * d + 2),
        setup,
        "mqa_topk(mqa_logits(...))",
        memory=True,
    )


def _paged_case(b, ctx, h, d, block_kv) -> Case:
    def setup():
        g = torch.Generator().manual_seed(5)
        lengths = [int(ctx * f) for f in torch.empty(b).uniform_(0.7, 1.3, generator=g).tolist()]
        cache, table, values = _paged_fp8_cache([torch.randn(n, d, generator=g) for n in lengths], block_kv)
        q = torch.randn(b, 1, h, d, generator=g).to(torch.float8_e4m3fn)
        w = torch.rand(b, h, generator=g)
        lens = torch.tensor(lengths, dtype=torch.int32).view(b, 1)
        width = max(lengths)

        def naive():  # gather every request's tokens (dequantized), then the formula per request
            out = torch.full((b, width), float("-inf"))
            qf = q.float()
            for r, n in enumerate(lengths):
                scores = torch.einsum("hd,jd->hj", qf[r, 0], values[r][:n].float()).relu()
                out[r, :n] = w[r] @ scores
            return out

        return (lambda: paged_mqa_logits(q, cache, w, lens, table, width)), naive

    return Case(
        f"paged_mqa_logits fp8 B{b} ctx~{ctx} H{h} D{d} block{block_kv}",
        b * h * ctx * (2 * d + 2),
        setup,
        "per-request einsum on pre-dequantized KV",
        memory=True,
    )


def _sparse_case(s, s_kv, h, d, sbk, nb) -> Case:
    """DeepSeek V4.1's second-level indexer: ``sparse_mqa_logits`` on ``nb`` candidate blocks per query against the
    dense op over the whole range, gathered at the same tokens (what a caller without the sparse op computes; the
    values are bitwise equal)."""

    def setup():
        g = torch.Generator().manual_seed(11)
        q = torch.randn(s, h, d, generator=g).to(torch.float8_e4m3fn)
        k8, k_sf = _fp8_rows(torch.randn(s_kv, d, generator=g))
        w = torch.rand(s, h, generator=g)
        ks, ke = _causal_ranges(s, s_kv)
        rows = []
        for b in ke.tolist():
            blocks = -(-b // sbk)
            picked = torch.randperm(blocks, generator=g)[: min(nb, blocks)].sort().values.tolist()
            rows.append(picked + [picked[-1] if picked else 0] * (nb - len(picked)))
        bi = torch.tensor(rows, dtype=torch.int32)
        cols = (bi.long().repeat_interleave(sbk, dim=1) * sbk + torch.arange(sbk).repeat(nb)).clamp(max=s_kv - 1)

        def dense_then_gather():
            return mqa_logits(q, k8, w, ks, ke, k_sf=k_sf, logits_dtype=torch.bfloat16).gather(1, cols)

        def ours():
            return sparse_mqa_logits(q, k8, w, ks, ke, bi, sbk, k_sf=k_sf, logits_dtype=torch.bfloat16)

        return ours, dense_then_gather

    return Case(
        f"sparse_mqa_logits fp8 S{s} S_kv{s_kv} H{h} D{d} SBK{sbk} NB{nb}",
        s * h * nb * sbk * (2 * d + 2),
        setup,
        "mqa_logits (dense, BF16) + gather",
        memory=True,
    )


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [
            _prefill_case(64, 256, 16, 64, "fp8"),
            _backward_case(32, 128, 8, 32),
            _topk_case(64, 512, 16, 64, 32),
            _paged_case(4, 256, 16, 64, 64),
            _sparse_case(32, 1024, 16, 64, 8, 16),
        ]
    return [
        _prefill_case(512, 4096, 64, 128, "fp8"),
        _prefill_case(512, 4096, 64, 128, "bf16"),
        _backward_case(256, 2048, 64, 128),
        _topk_case(1024, 16384, 64, 128, 2048),
        _paged_case(32, 4096, 64, 128, 64),
        _sparse_case(256, 16384, 32, 128, 16, 128),
    ]
