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
        BadInput(
            (q, kv.to("meta"), idx, 0.5, 8), r"argument 'kv' device: expected \S+ \(same as 'q'\), got meta", "device"
        ),
    ]


# ---- sparse_mla_decode: paged FP8/FP4 caches in each record format, written by an independent builder ----


def _paged(tokens: int, page: int, size: int, g: torch.Generator, block_bytes: int | None = None):
    """A cache of randomly permuted physical blocks with one block nobody uses, every byte 0xFF (NaN in E4M3,
    FP32 and BF16) until written: ``(buffer [blocks, block_bytes] uint8, record number of each token)``. A block
    holds one spare row unless ``block_bytes`` says otherwise (a block stride larger than the page)."""
    blocks = -(-tokens // page) + 1
    buffer = torch.full((blocks, block_bytes or (page + 1) * size), 0xFF, dtype=torch.uint8)
    physical = torch.randperm(blocks, generator=g)
    return buffer, torch.tensor([int(physical[t // page]) * page + t % page for t in range(tokens)])


def _own(x: torch.Tensor) -> torch.Tensor:
    """``x`` on its storage (the 0xFF bytes around it kept) but not a view: an exported program's input guards
    read a view's base, which torch.save / torch.load does not keep."""
    return torch.empty(0, dtype=x.dtype).set_(x.untyped_storage(), x.storage_offset(), x.shape, x.stride())


def _pow2_scales(groups: torch.Tensor) -> torch.Tensor:
    """FlashMLA's tests' E4M3 tile scales: ``2^ceil(log2(max(amax / 448, 1e-4)))`` per group (last dim)."""
    return torch.exp2(torch.ceil(torch.log2(groups.abs().amax(dim=-1).clamp(min=1e-4 * 448) / 448)))


def write_v32_cache(values: torch.Tensor, page: int, g: torch.Generator):
    """``values [tokens, 576]`` quantized as FlashMLA's tests do (per 128 NoPE values a power-of-two scale, RoPE as
    BF16) into 656-byte records. Returns ``(k_cache [blocks, page, 1, 656] uint8, record number of each token,
    the dequantized values [tokens, 576] fp64)``."""
    tokens = values.shape[0]
    buffer, record = _paged(tokens, page, 656, g)
    rows = buffer.view(buffer.shape[0], page + 1, 656)
    nope = values[:, :512].float().view(tokens, 4, 128)
    scales = _pow2_scales(nope)
    codes = (nope / scales[..., None]).to(torch.float8_e4m3fn)
    rope = values[:, 512:].to(torch.bfloat16)
    exact = torch.cat([(codes.double() * scales.double()[..., None]).view(tokens, 512), rope.double()], dim=1)
    for t in range(tokens):
        row = rows[int(record[t]) // page, int(record[t]) % page]
        row[:512] = codes[t].reshape(-1).view(torch.uint8)
        row[512:528] = scales[t].contiguous().view(torch.uint8)
        row[528:] = rope[t].contiguous().view(torch.uint8)
    return _own(rows[:, :page, None, :]), record, exact


def write_v4_cache(values: torch.Tensor, page: int, g: torch.Generator):
    """DeepSeek-V4's 584-byte records, block-major as upstream's ``quantize_k_cache`` lays them out: in each block
    ``page`` rows of 448 E4M3 NoPE codes + 64 BF16 RoPE values, then ``page`` rows of 7 UE8M0 codes (a power-of-two
    scale per 64 NoPE values) and a pad byte; blocks padded to a multiple of 576 bytes."""
    tokens = values.shape[0]
    buffer, record = _paged(tokens, page, 584, g, block_bytes=-(-page * 584 // 576) * 576)
    nope = values[:, :448].float().view(tokens, 7, 64)
    scales = _pow2_scales(nope)
    codes = (nope / scales[..., None]).to(torch.float8_e4m3fn)
    rope = values[:, 448:].to(torch.bfloat16)
    exact = torch.cat([(codes.double() * scales.double()[..., None]).view(tokens, 448), rope.double()], dim=1)
    for t in range(tokens):
        block, k = int(record[t]) // page, int(record[t]) % page
        buffer[block, 576 * k : 576 * k + 448] = codes[t].reshape(-1).view(torch.uint8)
        buffer[block, 576 * k + 448 : 576 * (k + 1)] = rope[t].contiguous().view(torch.uint8)
        buffer[block, 576 * page + 8 * k : 576 * page + 8 * k + 7] = (torch.log2(scales[t]) + 127).to(torch.uint8)
    return _own(buffer[:, : page * 584].view(-1, page, 1, 584)), record, exact


def write_v41_cache(values: torch.Tensor, page: int, g: torch.Generator):
    """V4.1's 528-byte records: ``values [tokens, 512]`` in E4M3 with a power-of-two scale per 32 values stored as
    UE8M0 codes after the 512 data bytes (token-interleaved, the Ascend release's form)."""
    tokens = values.shape[0]
    buffer, record = _paged(tokens, page, 528, g)
    rows = buffer.view(buffer.shape[0], page + 1, 528)
    groups = values.float().view(tokens, 16, 32)
    scales = _pow2_scales(groups)
    codes = (groups / scales[..., None]).to(torch.float8_e4m3fn)
    exact = (codes.double() * scales.double()[..., None]).view(tokens, 512)
    for t in range(tokens):
        row = rows[int(record[t]) // page, int(record[t]) % page]
        row[:512] = codes[t].reshape(-1).view(torch.uint8)
        row[512:] = (torch.log2(scales[t]) + 127).to(torch.uint8)
    return _own(rows[:, :page, None, :]), record, exact


E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float64)


def write_fp4_cache(values: torch.Tensor, page: int, g: torch.Generator):
    """V4.1's 288-byte FP4 records: per 16 values an E4M3 scale (amax / 6 rounded up to an E4M3 value: not a power
    of two in general), values rounded to the nearest E2M1 magnitude, packed two per byte (even index in the low
    nibble), the 32 scales after the 256 data bytes."""
    tokens = values.shape[0]
    buffer, record = _paged(tokens, page, 288, g)
    rows = buffer.view(buffer.shape[0], page + 1, 288)
    groups = values.double().view(tokens, 32, 16)
    target = (groups.abs().amax(dim=-1) / 6).clamp(min=2.0**-9)
    scales = target.to(torch.float8_e4m3fn)
    scales = torch.where(scales.double() < target, (scales.view(torch.uint8) + 1).view(torch.float8_e4m3fn), scales)
    scaled = groups / scales.double()[..., None]
    magnitude = (scaled.abs()[..., None] - E2M1).abs().argmin(dim=-1)  # nearest E2M1 magnitude
    nibbles = (magnitude + 8 * (scaled < 0)).view(tokens, 256, 2)
    exact = (torch.where(scaled < 0, -E2M1[magnitude], E2M1[magnitude]) * scales.double()[..., None]).view(tokens, 512)
    for t in range(tokens):
        row = rows[int(record[t]) // page, int(record[t]) % page]
        row[:256] = (nibbles[t, :, 0] | (nibbles[t, :, 1] << 4)).to(torch.uint8)
        row[256:] = scales[t].view(torch.uint8)
    return _own(rows[:, :page, None, :]), record, exact


WRITERS = {656: write_v32_cache, 584: write_v4_cache, 528: write_v41_cache, 288: write_fp4_cache}


def _dequantized(k_cache: torch.Tensor, record: int) -> torch.Tensor:
    """One record read back from its bytes in fp64, independently of the op's code."""
    page, size = k_cache.shape[1], k_cache.shape[3]
    if size == 584:
        block = k_cache[record // page].reshape(-1)
        k = record % page
        row, codes = block[576 * k : 576 * (k + 1)], block[576 * page + 8 * k : 576 * page + 8 * k + 7]
        nope = row[:448].view(torch.float8_e4m3fn).double() * torch.exp2(codes.double() - 127).repeat_interleave(64)
        return torch.cat([nope, row[448:].clone().view(torch.bfloat16).double()])
    raw = k_cache[record // page, record % page, 0]
    if size == 288:
        nibbles = torch.stack([raw[:256] & 15, raw[:256] >> 4], dim=-1).reshape(-1).long()
        values = torch.where(nibbles >= 8, -E2M1[nibbles % 8], E2M1[nibbles % 8])
        return values * raw[256:].view(torch.float8_e4m3fn).double().repeat_interleave(16)
    codes = raw[:512].view(torch.float8_e4m3fn).double()
    if size == 528:
        return codes * torch.exp2(raw[512:].double() - 127).repeat_interleave(32)
    scales = raw[512:528].clone().view(torch.float32).double()
    rope = raw[528:].clone().view(torch.bfloat16).double()
    return torch.cat([codes * scales.repeat_interleave(128), rope])


def paged_scope(lens, s_q: int, topk: int, page: int, size: int, g: torch.Generator, scale: float = 1.0):
    """One KV scope of ``len(lens)`` requests: ``(k_cache, indices [b, s_q, topk] int32)``, each query token picking
    random records of its own request (repeats included), a quarter of the picks replaced by invalid values (-1,
    the int32 extremes, the first record past the cache); a request with no tokens picks -1 only."""
    d_qk = 576 if size == 656 else 512
    values = torch.randn(sum(lens), d_qk, generator=g).clamp(-1, 1) / 10 * scale
    k_cache, record, _ = WRITERS[size](values, page, g)
    indices = torch.full((len(lens), s_q, topk), -1, dtype=torch.int32)
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
    return k_cache, indices


# (b, s_q, h_q, d_v, tokens per request, topk, page, sink, topk_length, bytes per record,
#  extra scope: None or (bytes per record, tokens per request, topk, page, extra_topk_length))
_DECODE_CASES = [
    (2, 2, 16, 512, (40, 23), 32, 5, True, True, 656, None),
    (3, 1, 4, 64, (9, 0, 70), 16, 64, False, False, 656, None),
    (1, 3, 8, 128, (17,), 24, 2, True, False, 656, None),
    (2, 2, 8, 512, (33, 12), 16, 7, True, True, 528, None),
    (2, 1, 8, 512, (30, 9), 16, 3, True, True, 584, (584, (11, 40), 8, 2, True)),
    (2, 2, 4, 256, (21, 0), 8, 4, False, True, 528, (288, (0, 35), 16, 5, True)),
]
_DECODE_SMALL = [
    (1, 1, 2, 8, (6,), 4, 3, True, True, 656, None),
    (2, 1, 1, 4, (3, 5), 3, 2, False, False, 528, (288, (4, 2), 2, 3, True)),
]


def decode_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(21)
    out = []
    for b, s_q, h_q, d_v, lens, topk, page, sink, length, size, extra in _DECODE_SMALL if small else _DECODE_CASES:
        d_qk = 576 if size == 656 else 512
        k_cache, indices = paged_scope(lens, s_q, topk, page, size, g, scale=1 if small else 10)
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
        args = (q, k_cache.to(device), indices.to(device), scale, d_v, attn_sink, topk_length)
        if extra is not None:
            e_size, e_lens, e_topk, e_page, e_length = extra
            e_cache, e_indices = paged_scope(e_lens, s_q, e_topk, e_page, e_size, g, scale=1 if small else 10)
            e_len = torch.randint(0, e_topk + 1, (b,), generator=g, dtype=torch.int32) if e_length else None
            args += (e_cache.to(device), e_indices.to(device), None if e_len is None else e_len.to(device))
            name += f" extra {e_size}B top{e_topk} page{e_page} len={e_length}"
        out.append(SampleInput(args, name))
    return out


def _picked(k_cache, indices, lengths, r: int, s: int) -> list[torch.Tensor]:
    total = k_cache.shape[0] * k_cache.shape[1]
    return [
        _dequantized(k_cache, int(i))
        for j, i in enumerate(indices[r, s].tolist())
        if 0 <= i < total and (lengths is None or j < int(lengths[r]))
    ]


def decode_reference(
    q, k_cache, indices, sm_scale, d_v, attn_sink, topk_length, extra_k_cache=None, extra_indices=None,
    extra_topk_length=None,
):  # fmt: skip
    b, s_q, h_q, _ = q.shape
    out = torch.zeros(b, s_q, h_q, d_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64)
    for r in range(b):
        for s in range(s_q):
            picked = _picked(k_cache, indices, topk_length, r, s)
            if extra_k_cache is not None:  # the two scopes share one softmax
                picked += _picked(extra_k_cache, extra_indices, extra_topk_length, r, s)
            if not picked:
                continue
            rows = torch.stack(picked)
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
    v4 = torch.zeros(3, 4, 1, 600, dtype=torch.uint8)[..., :584]  # rows 600 bytes apart: not block-major runs
    fp4 = torch.zeros(3, 4, 1, 288, dtype=torch.uint8)
    q512 = q[..., :512]
    return [
        BadInput((q[0], cache, idx, 0.1, 512), r"argument 'q' rank: expected 4-D \[b, s_q, h_q, d_qk\]", "q rank"),
        BadInput((q.half(), cache, idx, 0.1, 512), r"argument 'q' dtype: expected one of torch.bfloat16", "q dtype"),
        BadInput((q512, cache, idx, 0.1, 512), r"argument 'q' size\(3\) \(d_qk\): expected 576", "d_qk"),
        BadInput((q, cache.float(), idx, 0.1, 512), r"argument 'k_cache' dtype: expected torch.uint8", "cache dtype"),
        BadInput((q, cache[..., :600], idx, 0.1, 512), r"argument 'k_cache' size\(3\) \(bytes_per_token\)", "bytes"),
        BadInput((q, cache[0], idx, 0.1, 512), r"argument 'k_cache' rank: expected 4-D", "cache rank"),
        BadInput((q512, v4, idx, 0.1, 512), r"argument 'k_cache' stride\(1\): expected 584, got 600", "V4 stride"),
        BadInput((q, cache, idx.long(), 0.1, 512), r"argument 'indices' dtype: expected torch.int32", "idx dtype"),
        BadInput((q, cache, idx[:1], 0.1, 512), r"argument 'indices' size\(0\) \(b\): expected 2", "idx b"),
        BadInput((q, cache, idx, 0.1, 513), r"argument 'd_v' value: expected at most 512", "d_v"),
        BadInput(
            (q, cache, idx, 0.1, 512, None, torch.zeros(3, dtype=torch.int32)),
            r"argument 'topk_length' size\(0\) \(b\): expected 2",
            "length b",
        ),
        BadInput((q, cache, idx, 0.1, 512, torch.zeros(3)), r"argument 'attn_sink' size\(0\) \(h_q\)", "sink h"),
        BadInput(
            (q, cache, idx, 0.1, 512, None, None, None, idx),
            r"argument 'extra_indices' value: expected None \(no extra_k_cache\)",
            "extra indices alone",
        ),
        BadInput(
            (q, cache, idx, 0.1, 512, None, None, fp4),
            r"argument 'q' size\(3\) \(d_qk\): expected 512 \(the 288-byte record's\)",
            "extra cache of another d_qk",
        ),
        BadInput(
            (q512, fp4, idx, 0.1, 512, None, None, fp4),
            r"argument 'extra_indices' value: expected a tensor \(extra_k_cache given\)",
            "extra cache without indices",
        ),
        BadInput(
            (q512, fp4, idx, 0.1, 512, None, None, fp4, idx[:, :, :2], torch.zeros(2)),
            r"argument 'extra_topk_length' dtype: expected torch.int32",
            "extra length dtype",
        ),
        BadInput(
            (q512, fp4, idx, 0.1, 512, None, None, fp4, idx.transpose(0, 1)),
            r"argument 'extra_indices' size\(0\) \(b\): expected 2",
            "extra indices b",
        ),
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
