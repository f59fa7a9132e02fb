"""Sample inputs, fp64 reference, bad inputs and the harness spec of the sparse_mla family.

FlashMLA's sparse-prefill test data scaled down for a CPU (specs/flashmla_api.md §9): q and kv ~ N(0, 1)/10 plus a
random offset, non-contiguous views; indices are random rows of [0, s_kv) mixed with upstream's invalid values
(-2^31, -123456, -1, s_kv, 114514, 1919810, 2147480000, 2^31 - 1), repeated rows, a token with no valid index;
attention sinks with +-inf entries; topk_length in [0, topk]. Both head dims of upstream (d_qk 576 and 512 with
d_v 512) in the large samples, small dims for gradcheck. The reference loops over tokens in fp64, written from the
spec's formulas, independently of the kernels.
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe.backends.portable import sparse_mla as portable
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

INVALID = (-(2**31), -123456, -1, 114514, 1919810, 2147480000, 2**31 - 1)

# (s_q, h_q, d_qk, d_v, s_kv, topk, sink, topk_length)
_CASES = [
    (6, 64, 576, 512, 95, 128, False, False),
    (9, 16, 512, 512, 300, 64, True, True),
    (13, 4, 96, 64, 40, 48, True, False),
    (5, 2, 64, 32, 7, 16, False, True),
    (0, 4, 64, 64, 10, 8, False, False),
]
_CASES_SMALL = [(3, 2, 16, 8, 9, 6, True, True), (4, 3, 8, 8, 5, 7, False, False)]


def make_indices(s_q: int, s_kv: int, topk: int, g: torch.Generator, lonely: bool = True) -> torch.Tensor:
    idx = torch.randint(0, max(s_kv, 1), (s_q, 1, topk), generator=g, dtype=torch.int64)
    invalid = torch.tensor([*INVALID, s_kv], dtype=torch.int64)
    mask = torch.rand(s_q, 1, topk, generator=g) < 0.3
    idx = torch.where(mask, invalid[torch.randint(0, len(invalid), idx.shape, generator=g)], idx)
    if s_q > 1 and topk > 1:
        idx[0, 0, 1] = idx[0, 0, 0]  # a repeated row counts twice, as upstream's kernels do
    if lonely and s_q > 2:
        idx[s_q // 2] = invalid[torch.randint(0, len(invalid), (topk,), generator=g)]
    return idx.to(torch.int32)


def _strided(x: torch.Tensor, strides) -> torch.Tensor:
    return torch.empty_strided(x.shape, strides, dtype=x.dtype).copy_(x)


def samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(20)
    out = []
    for s_q, h_q, d_qk, d_v, s_kv, topk, sink, length in _CASES_SMALL if small else _CASES:
        q = torch.randn(s_q, h_q, d_qk, generator=g) / 10 + torch.randn(1, generator=g) / 10
        kv = torch.randn(s_kv, 1, d_qk, generator=g) / 10 + torch.randn(1, generator=g) / 10
        if not small:  # larger logits than N(0, 1)/10 gives: the softmax is not flat
            q = q * 30
        # Non-contiguous, as upstream's test: q every other element of a wider row, kv every other row (strided
        # tensors of their own, not views: an exported program's guards read a view's base).
        q = _strided(q.to(dtype), (h_q * 2 * d_qk, 2 * d_qk, 2))
        kv = _strided(kv.to(dtype), (2 * d_qk, d_qk, 1))
        q, kv = (t.to(device).requires_grad_(requires_grad) for t in (q, kv))
        indices = make_indices(s_q, s_kv, topk, g, lonely=not small).to(device)
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        attn_sink = None
        if sink:
            attn_sink = torch.randn(h_q, generator=g).to(acc)
            if not small and h_q >= 4:
                attn_sink[0], attn_sink[1] = math.inf, -math.inf
            attn_sink = attn_sink.to(device).requires_grad_(requires_grad and small)
        topk_length = None
        if length:
            topk_length = torch.randint(0 if not small else 1, topk + 1, (s_q,), generator=g, dtype=torch.int32)
            topk_length = topk_length.to(device)
        sm_scale = d_qk**-0.5 if not small else 0.5
        name = f"s_q{s_q} h{h_q} d{d_qk}/{d_v} s_kv{s_kv} top{topk} sink={sink} length={length}"
        out.append(SampleInput((q, kv, indices, sm_scale, d_v, attn_sink, topk_length), name))
    return out


def reference(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    q64, kv64 = q.detach().double(), kv.detach().double()[:, 0, :]
    s_q, h_q, _ = q.shape
    out = torch.zeros(s_q, h_q, d_v, dtype=torch.float64)
    max_logits = torch.full((s_q, h_q), -math.inf, dtype=torch.float64)
    lse = torch.full((s_q, h_q), math.inf, dtype=torch.float64)
    for i in range(s_q):
        positions = [
            j
            for j, index in enumerate(indices[i, 0].tolist())
            if 0 <= index < kv.shape[0] and (topk_length is None or j < int(topk_length[i]))
        ]
        if not positions:
            continue
        rows = kv64[[int(indices[i, 0, j]) for j in positions]]
        logits = sm_scale * q64[i] @ rows.T  # [h, n]
        max_logits[i] = logits.max(dim=-1).values
        lse[i] = torch.logsumexp(logits, dim=-1)
        softmax = torch.softmax(logits, dim=-1)
        out[i] = softmax @ rows[:, :d_v]
        if attn_sink is not None:
            out[i] *= torch.sigmoid(lse[i] - attn_sink.detach().double())[:, None]  # exp(lse)/(exp(lse)+exp(sink))
    return out, max_logits, lse


def bad_inputs(device) -> list[BadInput]:
    q, kv = torch.randn(4, 2, 16), torch.randn(9, 1, 16)
    idx = torch.zeros(4, 1, 5, dtype=torch.int32)
    sink, length = torch.zeros(2), torch.zeros(4, dtype=torch.int32)
    return [
        BadInput((q[0], kv, idx, 0.5, 8), r"argument 'q' rank: expected 3-D \[s_q, h_q, d_qk\]", "q rank"),
        BadInput((q.int(), kv, idx, 0.5, 8), r"argument 'q' dtype: expected one of torch.bfloat16", "q dtype"),
        BadInput((q, kv.double(), idx, 0.5, 8), r"argument 'kv' dtype: expected torch.float32 \(same as 'q'\)", "kv"),
        BadInput((q, kv.expand(9, 2, 16), idx, 0.5, 8), r"argument 'kv' size\(1\) \(h_kv\): expected 1", "h_kv"),
        BadInput(
            (q, kv[..., :8], idx, 0.5, 8), r"argument 'kv' size\(2\) \(d_qk\): expected 16 \(q.size\(2\)\)", "dqk"
        ),
        BadInput((q, kv, idx.long(), 0.5, 8), r"argument 'indices' dtype: expected torch.int32", "indices dtype"),
        BadInput((q, kv, idx[:3], 0.5, 8), r"argument 'indices' size\(0\) \(s_q\): expected 4", "indices s_q"),
        BadInput((q, kv, idx[0], 0.5, 8), r"argument 'indices' rank: expected 3-D", "indices rank"),
        BadInput((q, kv, idx, 0.5, 0), r"argument 'd_v' value: expected a positive integer, got 0", "d_v 0"),
        BadInput((q, kv, idx, 0.5, 17), r"argument 'd_v' value: expected at most d_qk = 16, got 17", "d_v big"),
        BadInput((q, kv, idx, 0.5, 8, sink[:1]), r"argument 'attn_sink' size\(0\) \(h_q\): expected 2", "sink h"),
        BadInput((q, kv, idx, 0.5, 8, sink.bfloat16()), r"argument 'attn_sink' dtype: expected torch.float32", "sink"),
        BadInput((q, kv, idx, 0.5, 8, None, length[:2]), r"argument 'topk_length' size\(0\) \(s_q\)", "length s_q"),
        BadInput((q, kv, idx, 0.5, 8, None, length.long()), r"argument 'topk_length' dtype", "length dtype"),
        BadInput((q, kv.to("meta"), idx, 0.5, 8), r"argument 'kv' device: expected cpu \(same as 'q'\)", "device"),
    ]


# ---- sparse_mla_decode: DeepSeek-V3.2's paged FP8 cache, written by an independent builder ----


def write_v32_cache(values: torch.Tensor, page: int, g: torch.Generator):
    """``values [tokens, 576]`` quantized as FlashMLA's tests do (per 128 NoPE values a power-of-two scale
    ``2^ceil(log2(max(amax / 448, 1e-4)))``, RoPE as BF16) into 656-byte records of randomly permuted physical
    blocks with one spare row each (a block stride larger than the page); every byte nobody wrote is 0xFF (NaN in
    E4M3, FP32 and BF16). Returns ``(k_cache [blocks, page, 1, 656] uint8, record number of each token, the
    dequantized values [tokens, 576] fp64)``."""
    tokens = values.shape[0]
    blocks = -(-tokens // page) + 1  # one block nobody uses
    buffer = torch.full((blocks, page + 1, 1, 656), 0xFF, dtype=torch.uint8)
    physical = torch.randperm(blocks, generator=g)
    record = torch.tensor([int(physical[t // page]) * page + t % page for t in range(tokens)])
    nope = values[:, :512].float().view(tokens, 4, 128)
    amax = nope.abs().amax(dim=-1).clamp(min=1e-4 * 448)
    scales = torch.exp2(torch.ceil(torch.log2(amax / 448)))
    codes = (nope / scales[..., None]).to(torch.float8_e4m3fn)
    rope = values[:, 512:].to(torch.bfloat16)
    exact = torch.cat([(codes.double() * scales.double()[..., None]).view(tokens, 512), rope.double()], dim=1)
    for t in range(tokens):
        row = buffer[int(record[t]) // page, int(record[t]) % page, 0]
        row[:512] = codes[t].reshape(-1).view(torch.uint8)
        row[512:528] = scales[t].contiguous().view(torch.uint8)
        row[528:] = rope[t].contiguous().view(torch.uint8)
    return buffer[:, :page], record, exact


def write_v41_cache(values: torch.Tensor, page: int, g: torch.Generator):
    """As ``write_v32_cache`` for V4.1's 528-byte records: ``values [tokens, 512]`` in E4M3 with a power-of-two
    scale per 32 values stored as UE8M0 codes after the 512 data bytes (token-interleaved, the Ascend release's
    form)."""
    tokens = values.shape[0]
    blocks = -(-tokens // page) + 1
    buffer = torch.full((blocks, page + 1, 1, 528), 0xFF, dtype=torch.uint8)
    physical = torch.randperm(blocks, generator=g)
    record = torch.tensor([int(physical[t // page]) * page + t % page for t in range(tokens)])
    groups = values.float().view(tokens, 16, 32)
    exponents = torch.ceil(torch.log2(groups.abs().amax(dim=-1).clamp(min=1e-4 * 448) / 448))
    codes = (groups / torch.exp2(exponents)[..., None]).to(torch.float8_e4m3fn)
    exact = (codes.double() * torch.exp2(exponents).double()[..., None]).view(tokens, 512)
    for t in range(tokens):
        row = buffer[int(record[t]) // page, int(record[t]) % page, 0]
        row[:512] = codes[t].reshape(-1).view(torch.uint8)
        row[512:] = (exponents[t] + 127).to(torch.uint8)
    return buffer[:, :page], record, exact


# (b, s_q, h_q, d_v, tokens per request, topk, page, sink, topk_length, bytes per record)
_DECODE_CASES = [
    (2, 2, 16, 512, (40, 23), 32, 5, True, True, 656),
    (3, 1, 4, 64, (9, 0, 70), 16, 64, False, False, 656),
    (1, 3, 8, 128, (17,), 24, 2, True, False, 656),
    (2, 2, 8, 512, (33, 12), 16, 7, True, True, 528),
]
_DECODE_SMALL = [(1, 1, 2, 8, (6,), 4, 3, True, True, 656), (2, 1, 1, 4, (3, 5), 3, 2, False, False, 528)]


def decode_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(21)
    out = []
    for b, s_q, h_q, d_v, lens, topk, page, sink, length, size in _DECODE_SMALL if small else _DECODE_CASES:
        d_qk = 576 if size == 656 else 512
        values = torch.randn(sum(lens), d_qk, generator=g).clamp(-1, 1) / 10 * (1 if small else 10)
        k_cache, record, _ = (write_v32_cache if size == 656 else write_v41_cache)(values, page, g)
        indices = torch.full((b, s_q, topk), -1, dtype=torch.int32)
        start = 0
        for r, n in enumerate(lens):
            for s in range(s_q):
                picks = torch.randint(0, max(n, 1), (topk,), generator=g)
                chosen = record[start + picks] if n else torch.full((topk,), -1)
                drop = torch.rand(topk, generator=g) < 0.25
                bad = torch.tensor([-1, -(2**31), 2**31 - 1, k_cache.shape[0] * page])
                chosen = torch.where(drop, bad[torch.randint(0, 4, (topk,), generator=g)], chosen)
                indices[r, s] = chosen.to(torch.int32)
            start += n
        q = (torch.randn(b, s_q, h_q, d_qk, generator=g).clamp(-1, 1) * (1 if small else 3)).to(dtype)
        q = q.to(device).requires_grad_(requires_grad)
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        attn_sink = None
        if sink:
            attn_sink = torch.randn(h_q, generator=g).to(acc)
            if not small:
                attn_sink[0] = math.inf
            attn_sink = attn_sink.to(device).requires_grad_(requires_grad)
        topk_length = torch.randint(1, topk + 1, (b,), generator=g, dtype=torch.int32).to(device) if length else None
        name = f"{size}B b{b} s_q{s_q} h{h_q} d_v{d_v} lens{list(lens)} top{topk} page{page} sink={sink} len={length}"
        scale = d_qk**-0.55  # upstream's decode tests
        out.append(SampleInput((q, k_cache.to(device), indices.to(device), scale, d_v, attn_sink, topk_length), name))
    return out


def _dequantized(k_cache: torch.Tensor, record: int) -> torch.Tensor:
    """One record read back from its bytes in fp64, independently of the op's code."""
    page = k_cache.shape[1]
    raw = k_cache[record // page, record % page, 0]
    if raw.shape[0] == 528:
        codes = raw[:512].view(torch.float8_e4m3fn).double()
        return codes * torch.exp2(raw[512:].double() - 127).repeat_interleave(32)
    codes = raw[:512].view(torch.float8_e4m3fn).double()
    scales = raw[512:528].clone().view(torch.float32).double()
    rope = raw[528:].clone().view(torch.bfloat16).double()
    return torch.cat([codes * scales.repeat_interleave(128), rope])


def decode_reference(q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length):
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, d_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64)
    total = k_cache.shape[0] * k_cache.shape[1]
    for r in range(b):
        for s in range(s_q):
            picked = [
                int(i)
                for j, i in enumerate(indices[r, s].tolist())
                if 0 <= i < total and (topk_length is None or j < int(topk_length[r]))
            ]
            if not picked:
                continue
            rows = torch.stack([_dequantized(k_cache, i) for i in picked])
            logits = sm_scale * q[r, s].detach().double() @ rows.T
            lse[r, :, s] = torch.logsumexp(logits, dim=-1)
            out[r, s] = torch.softmax(logits, dim=-1) @ rows[:, :d_v]
            if attn_sink is not None:
                out[r, s] *= torch.sigmoid(lse[r, :, s] - attn_sink.detach().double())[:, None]
    return out, lse


def decode_bad_inputs(device) -> list[BadInput]:
    q = torch.randn(2, 1, 4, 576)
    cache = torch.zeros(3, 4, 1, 656, dtype=torch.uint8)
    idx = torch.zeros(2, 1, 8, dtype=torch.int32)
    return [
        BadInput((q[0], cache, idx, 0.1, 512), r"argument 'q' rank: expected 4-D \[b, s_q, h_q, d_qk\]", "q rank"),
        BadInput((q.half(), cache, idx, 0.1, 512), r"argument 'q' dtype: expected one of torch.bfloat16", "q dtype"),
        BadInput((q[..., :512], cache, idx, 0.1, 512), r"argument 'q' size\(3\) \(d_qk\): expected 576", "d_qk"),
        BadInput((q, cache.float(), idx, 0.1, 512), r"argument 'k_cache' dtype: expected torch.uint8", "cache dtype"),
        BadInput((q, cache[..., :584], idx, 0.1, 512), r"argument 'k_cache' size\(3\) \(bytes_per_token\)", "bytes"),
        BadInput((q, cache[0], idx, 0.1, 512), r"argument 'k_cache' rank: expected 4-D", "cache rank"),
        BadInput((q, cache, idx.long(), 0.1, 512), r"argument 'indices' dtype: expected torch.int32", "idx dtype"),
        BadInput((q, cache, idx[:1], 0.1, 512), r"argument 'indices' size\(0\) \(b\): expected 2", "idx b"),
        BadInput((q, cache, idx, 0.1, 513), r"argument 'd_v' value: expected at most 512", "d_v"),
        BadInput(
            (q, cache, idx, 0.1, 512, None, torch.zeros(3, dtype=torch.int32)),
            r"argument 'topk_length' size\(0\) \(b\): expected 2",
            "length b",
        ),
        BadInput((q, cache, idx, 0.1, 512, torch.zeros(3)), r"argument 'attn_sink' size\(0\) \(h_q\)", "sink h"),
    ]


SPECS = [
    OpSpec(
        "sparse_mla_prefill",
        samples,
        reference,
        bad_inputs,
        portable.sparse_mla_prefill,
        dtypes=(torch.bfloat16, torch.float32),
    ),
    OpSpec(
        "sparse_mla_decode",
        decode_samples,
        decode_reference,
        decode_bad_inputs,
        portable.sparse_mla_decode,
        dtypes=(torch.bfloat16, torch.float32),
        aoti="the kernel is Python (the records dequantized, then the prefill op): an AOTInductor (C++-only) "
        "deployment cannot run it",
    ),
]
