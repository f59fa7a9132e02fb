"""Sample inputs, fp64 references, bad inputs and the harness specs of the mqa_logits family.

Shapes are DeepGEMM's test shapes scaled down for a CPU, with its two range patterns (causal suffix and
the context-parallel pattern), every operand format (BF16/FP32; FP8 q without scales and FP8 k with one
FP32 scale per token, upstream's; FP4 with 1x32 UE8M0 scales; FP8 with 1x32 E8M0 scales, DeepGEMM-Ascend's),
full and compressed outputs, BF16 weights/logits. Paged samples write real caches (DeepGEMM's and the
Ascend layout, FP8 and FP4) into randomly permuted physical blocks, with ``next_n`` > 1 and varlen runs.
References are computed in fp64 from the values the quantizers produced, independently of the kernels'
parsing code. ``dtype`` is the precision of the float operands, or of the logits for quantized samples.
"""

from __future__ import annotations

import dataclasses

import torch

from torch_ascend_moe import quant
from torch_ascend_moe.backends.portable import mqa_logits as portable
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

# ---- operands ----


def causal_ranges(s: int, s_kv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's causal-suffix pattern: ks = 0, ke[i] = i + S_kv - S."""
    ke = torch.arange(s, dtype=torch.int32) + (s_kv - s)
    return torch.zeros(s, dtype=torch.int32), ke.clamp(min=0)


def context_parallel_ranges(s: int, s_kv: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM's context-parallel pattern: two chunks of S/2 queries, ke offsets cp_id * S/2 + i and
    (2 cp_size - 1 - cp_id) * S/2 + i, with cp_size = S_kv / S and cp_id = cp_size // 3."""
    half, cp_size = s // 2, s_kv // s
    cp_id = cp_size // 3
    i = torch.arange(half, dtype=torch.int32)
    ke = torch.cat([cp_id * half + i, (2 * cp_size - 1 - cp_id) * half + i])
    return torch.zeros(s, dtype=torch.int32), ke


def random_ranges(s: int, s_kv: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    ks = torch.randint(0, max(1, s_kv // 2), (s,), generator=g, dtype=torch.int32)
    ke = (ks + torch.randint(0, s_kv, (s,), generator=g, dtype=torch.int32)).clamp(max=s_kv)
    return ks, ke


def quantize(x: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``x [..., D]`` in ``fmt``: ``fp8`` (no scales), ``fp8-row`` (one FP32 scale per row, ``[..., 1]``),
    ``fp8-32`` (1x32 E8M0), ``fp4`` (packed uint8, 1x32 UE8M0 as FP32)."""
    rows = x.reshape(-1, x.shape[-1]).float()
    lead = list(x.shape[:-1])
    if fmt == "fp8":
        return x.to(torch.float8_e4m3fn), None
    if fmt == "fp8-row":
        data, sf = quant.per_custom_dims_cast_to_fp8(rows, (0,), False)
        return data.view(x.shape), sf.view([*lead, 1])
    if fmt == "fp8-32":
        data, sf = quant.per_token_cast_to_fp8(rows, True, gran_k=32)
        return data.view(x.shape), sf.view([*lead, -1]).to(torch.float8_e8m0fnu)
    data, sf = quant.per_token_cast_to_fp4(rows, True, gran_k=32)
    return data.view(torch.uint8).view([*lead, -1]), sf.view([*lead, -1])


def dequantized(x: torch.Tensor, sf: torch.Tensor | None) -> torch.Tensor:
    """fp64 values of an operand, through the quantizers' own inverses."""
    if x.dtype in (torch.bfloat16, torch.float32, torch.float64):
        return x.detach().double()
    rows = x.reshape(-1, x.shape[-1])
    if x.dtype == torch.uint8:
        values = quant.cast_back_from_fp4(rows.view(torch.int8), sf.float().reshape(rows.shape[0], -1), gran_k=32)
        return values.double().view([*x.shape[:-1], -1])
    if sf is None:
        return x.double()
    sf2 = sf.float().reshape(rows.shape[0], -1)
    return quant.dequantize_fp8(rows, sf2, 1, x.shape[-1] // sf2.shape[1]).double().view(x.shape)


def reference_logits(qd, kd, w, ks, ke, columns: int, compressed: bool) -> torch.Tensor:
    """fp64 logits of dequantized operands, -inf outside ``[ks, ke)``."""
    scores = torch.einsum("ihd,jd->ihj", qd, kd).relu()
    logits = torch.einsum("ihj,ih->ij", scores, w.double())
    out = torch.full((qd.shape[0], columns), float("-inf"), dtype=torch.float64)
    for i in range(qd.shape[0]):
        a, b = int(ks[i]), int(ke[i])
        if compressed:
            out[i, : b - a] = logits[i, a:b]
        else:
            out[i, a:b] = logits[i, a:b]
    return out


# ---- mqa_logits ----

# (S, H, D, S_kv, ranges, q format, k format, compressed, logits dtype for FP32 samples)
_CASES = [
    (24, 8, 32, 40, "causal", None, None, False, None),
    (16, 4, 64, 64, "cp", None, None, True, None),
    (20, 8, 64, 48, "causal", "fp8", "fp8-row", False, None),
    (12, 16, 64, 40, "random", "fp4", "fp4", True, None),
    (9, 8, 64, 33, "random", "fp8-32", "fp8-32", False, torch.bfloat16),
    (10, 8, 128, 24, "cp", "fp8", "fp4", False, None),
    (0, 8, 32, 16, "causal", None, None, False, None),
]
_CASES_SMALL = [
    (5, 4, 32, 9, "random", None, None, False, None),
    (4, 2, 32, 7, "causal", None, None, True, None),
    (6, 4, 64, 10, "random", "fp8", "fp8-row", True, None),
    (3, 2, 64, 5, "random", "fp4", "fp4", False, None),
]


def _ranges(kind: str, s: int, s_kv: int, g, dense: bool):
    if dense:  # every column valid: no -inf for float64 gradcheck's finite differences
        return torch.zeros(s, dtype=torch.int32), torch.full((s,), s_kv, dtype=torch.int32)
    if kind == "causal":
        return causal_ranges(s, s_kv)
    if kind == "cp":
        return context_parallel_ranges(s, s_kv)
    return random_ranges(s, s_kv, g)


def _operands(s, h, d, s_kv, q_fmt, k_fmt, dtype, logits_dtype, g, device, requires_grad):
    """(q, q_sf, k, k_sf, weights, logits dtype argument) of a sample: float operands in ``dtype`` (differentiable
    with ``requires_grad``), or quantized ones in their formats; weights in ``[0, H^-1/2)``."""
    q_hp, k_hp = torch.randn(s, h, d, generator=g), torch.randn(s_kv, d, generator=g)
    w = torch.rand(s, h, generator=g) / h**0.5
    if q_fmt is None:
        q, q_sf, k, k_sf = q_hp.to(dtype), None, k_hp.to(dtype), None
        w = w.to(torch.float64 if dtype == torch.float64 else dtype)
        out_dtype = None
    else:
        (q, q_sf), (k, k_sf) = quantize(q_hp, q_fmt), quantize(k_hp, k_fmt)
        out_dtype = logits_dtype
    q, k, w = q.to(device), k.to(device), w.to(device)
    if q_fmt is None:
        q, k = q.requires_grad_(requires_grad), k.requires_grad_(requires_grad)
    w.requires_grad_(requires_grad)
    q_sf = None if q_sf is None else q_sf.to(device)
    k_sf = None if k_sf is None else k_sf.to(device)
    return q, q_sf, k, k_sf, w, out_dtype


def mqa_logits_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(50)
    out = []
    for s, h, d, s_kv, kind, q_fmt, k_fmt, compressed, logits_dtype in _CASES_SMALL if small else _CASES:
        if q_fmt is not None and dtype != (logits_dtype or torch.float32):
            continue  # quantized operands: listed under their logits' precision
        ks, ke = _ranges(kind, s, s_kv, g, dense=dtype == torch.float64)
        q, q_sf, k, k_sf, w, out_dtype = _operands(
            s, h, d, s_kv, q_fmt, k_fmt, dtype, logits_dtype, g, device, requires_grad
        )
        max_seqlen = int((ke - ks).max()) if compressed and s else 0
        args = (q, q_sf, k, k_sf, w, ks.to(device), ke.to(device), max_seqlen, out_dtype)
        name = f"S{s} H{h} D{d} S_kv{s_kv} {kind} {q_fmt or dtype}x{k_fmt or dtype} compressed={compressed}"
        out.append(SampleInput(args, name))
    return out


def mqa_logits_reference(q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype):
    columns = max_seqlen_k if max_seqlen_k > 0 else k.shape[0]
    return reference_logits(dequantized(q, q_sf), dequantized(k, k_sf), weights, ks, ke, columns, max_seqlen_k > 0)


def mqa_logits_bad_inputs(device) -> list[BadInput]:
    q, k, w = torch.randn(4, 8, 64), torch.randn(10, 64), torch.rand(4, 8)
    ks, ke = torch.zeros(4, dtype=torch.int32), torch.full((4,), 10, dtype=torch.int32)
    q8, k8 = q.to(torch.float8_e4m3fn), k.to(torch.float8_e4m3fn)

    def call(**kw):
        args = dict(q=q, q_sf=None, k=k, k_sf=None, weights=w, ks=ks, ke=ke, max_seqlen_k=0, logits_dtype=None)
        return tuple((args | kw).values())

    return [
        BadInput(
            call(ks=torch.tensor([0, 5, 0, 0], dtype=torch.int32), ke=torch.tensor([3, 4, 3, 3], dtype=torch.int32)),
            r"argument 'ks' values: expected 0 <= ks\[i\] <= ke\[i\], got ks\[1\]=5, ke\[1\]=4",
            "ks > ke",
            data_dependent=True,
        ),
        BadInput(
            call(ke=torch.tensor([3, 11, 3, 3], dtype=torch.int32)),
            r"argument 'ke' values: expected ke\[i\] <= S_kv=10 \(k.size\(0\)\), got ke\[1\]=11",
            "ke > S_kv",
            data_dependent=True,
        ),
        BadInput(
            call(max_seqlen_k=5),
            r"argument 'max_seqlen_k' value: expected at least ke\[i\] - ks\[i\]",
            "compressed too narrow",
            data_dependent=True,
        ),
        BadInput(call(k=torch.randn(10, 32)), r"argument 'k' head dim \(D\): expected 64 \(q's D\), got 32", "D"),
        BadInput(
            call(q=q8, k=k8, k_sf=torch.ones(10, 3)),
            r"argument 'k_sf' shape: expected \[10, D / g\] with g dividing D=64, got \[10, 3\]",
            "k_sf shape",
        ),
        BadInput(
            call(q=q8, q_sf=torch.ones(4, 7, 2), k=k8), r"argument 'q_sf' shape: expected \[4, 8, D / g\]", "q_sf shape"
        ),
        BadInput(
            call(q=q8.view(torch.uint8), k=k8.view(torch.uint8)),
            r"argument 'q_sf' value: expected scales for a packed FP4 operand, got None",
            "FP4 without scales",
        ),
        BadInput(call(q=q8), r"argument 'k' dtype: expected torch.float8_e4m3fn or torch.uint8", "mixed float/FP8"),
        BadInput(
            call(q=q.half(), k=k.half()), r"argument 'q' dtype: expected torch.bfloat16, torch.float32", "q dtype"
        ),
        BadInput(call(q=torch.randn(4, 0, 64)), r"argument 'q' shape: expected H > 0 heads of D > 0", "H = 0"),
        BadInput(call(weights=torch.rand(4, 4)), r"argument 'weights' shape: expected \[4, 8\] \(S, H\)", "weights"),
        BadInput(
            call(weights=w.bfloat16(), logits_dtype=torch.float32),
            r"argument 'logits_dtype' value: expected torch.bfloat16 \(with BF16 weights\)",
            "logits dtype",
        ),
        BadInput(call(ks=ks.float()), r"argument 'ks' dtype: expected torch.int32 or torch.int64", "ks dtype"),
        BadInput(call(ke=ke[:3]), r"argument 'ke' size\(0\) \(S\): expected 4", "ke length"),
    ]


# ---- mqa_logits_backward ----


def backward_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    out = []
    masks = [[True, True, True], [True, False, True], [False, True, False]]
    for i, s in enumerate(mqa_logits_samples(device, dtype, False, small)):
        q, q_sf, k, k_sf, w, ks, ke, max_seqlen, _ = s.args
        columns = max_seqlen if max_seqlen > 0 else k.shape[0]
        g = torch.Generator().manual_seed(60 + i)
        grad = torch.randn(q.shape[0], columns, generator=g).to(w.dtype if dtype != torch.float64 else dtype)
        out.append(SampleInput((grad.to(device), q, q_sf, k, k_sf, w, ks, ke, max_seqlen, masks[i % 3]), s.name))
    return out


def backward_reference(grad, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, output_mask):
    qd = dequantized(q, q_sf).requires_grad_()
    kd = dequantized(k, k_sf).requires_grad_()
    wd = weights.detach().double().requires_grad_()
    columns = max_seqlen_k if max_seqlen_k > 0 else k.shape[0]
    logits = reference_logits(qd, kd, wd, ks, ke, columns, max_seqlen_k > 0)
    finite = torch.isfinite(logits)
    # The 0 * sum keeps the loss in the graph when every position is masked (S = 0).
    loss = (torch.where(finite, logits, 0) * torch.where(finite, grad.double(), 0)).sum() + 0 * (qd.sum() + kd.sum())
    loss = loss + 0 * wd.sum()
    grads = torch.autograd.grad(loss, (qd, kd, wd), allow_unused=True)
    return tuple(
        (gr if gr is not None else torch.zeros_like(x)) if need else x.new_empty(0)
        for gr, x, need in zip(grads, (qd, kd, wd), output_mask)
    )


def backward_bad_inputs(device) -> list[BadInput]:
    q, k, w = torch.randn(4, 8, 64), torch.randn(10, 64), torch.rand(4, 8)
    ks, ke = torch.zeros(4, dtype=torch.int32), torch.full((4,), 10, dtype=torch.int32)
    mask = [True, True, True]
    return [
        BadInput(
            (torch.randn(4, 9), q, None, k, None, w, ks, ke, 0, mask),
            r"argument 'grad' shape: expected \[4, 10\] \(the logits' shape\), got \[4, 9\]",
            "grad shape",
        ),
        BadInput(
            (torch.randn(4, 10), q, None, k, None, w, ke + 1, ke, 0, mask),
            r"argument 'ks' values: expected 0 <= ks\[i\] <= ke\[i\]",
            "ks > ke",
            data_dependent=True,
        ),
    ]


# ---- paged ----


@dataclasses.dataclass
class PagedCache:
    cache: torch.Tensor  # uint8 [num_blocks, block_kv, 1, bytes per token]
    block_table: torch.Tensor  # int32 [B, max_blocks]
    values: list[torch.Tensor]  # per request, fp64 dequantized [L_b, D]


def _token_bytes(k: torch.Tensor, fmt: str, ascend: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(data bytes [L, D or D/2], scale bytes [L, 4 or D/32], fp64 dequantized values) of KV tokens."""
    d = k.shape[1]
    if fmt == "fp8" and not ascend:
        data, sf = quant.per_custom_dims_cast_to_fp8(k, (0,), False)
        return data.view(torch.uint8), sf.view(-1, 1).view(torch.uint8), data.double() * sf.double().unsqueeze(1)
    if fmt == "fp8":
        data, sf = quant.per_token_cast_to_fp8(k, True, gran_k=32)
        values = quant.dequantize_fp8(data, sf, 1, 32).double()
        data = data.view(torch.uint8)
    else:
        packed, sf = quant.per_token_cast_to_fp4(k, True, gran_k=32)
        values = quant.cast_back_from_fp4(packed, sf, gran_k=32).double()
        data = packed.view(torch.uint8)
    codes = ((sf.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)  # UE8M0 = the FP32 exponent byte
    if not ascend:
        codes = torch.nn.functional.pad(codes, (0, 4 - d // 32), value=127)
    return data, codes, values


def build_paged_cache(
    ks_per_request: list[torch.Tensor], block_kv: int, fmt: str, ascend: bool, g: torch.Generator, spare: int = 2
) -> PagedCache:
    """Quantize each request's KV tokens into blocks at randomly permuted physical positions."""
    d = ks_per_request[0].shape[1]
    blocks_per = [-(-k.shape[0] // block_kv) for k in ks_per_request]
    max_blocks = max(blocks_per) + 1  # a spare column: table entries past a request's length are never read
    num_blocks = sum(blocks_per) + spare
    sf_bytes = d // 32 if ascend else 4
    data_bytes = d if fmt == "fp8" else d // 2
    cache = torch.randint(0, 256, (num_blocks, block_kv * (data_bytes + sf_bytes)), generator=g, dtype=torch.uint8)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    table = torch.full((len(ks_per_request), max_blocks), -7, dtype=torch.int32)  # garbage past the length
    values, next_block = [], 0
    for b, k in enumerate(ks_per_request):
        data, sf, deq = _token_bytes(k, fmt, ascend)
        values.append(deq)
        for p in range(blocks_per[b]):
            phys = perm[next_block]
            next_block += 1
            table[b, p] = phys
            rows = slice(p * block_kv, min((p + 1) * block_kv, k.shape[0]))
            n = rows.stop - rows.start
            cache[phys, : n * data_bytes] = data[rows].reshape(-1)
            cache[phys, block_kv * data_bytes : block_kv * data_bytes + n * sf_bytes] = sf[rows].reshape(-1)
    return PagedCache(cache.view(num_blocks, block_kv, 1, data_bytes + sf_bytes), table, values)


# (B, next_n, H, D, block_kv, q format, cache format, ascend layout, varlen, logits dtype)
_PAGED = [
    (3, 2, 8, 64, 16, "fp8", "fp8", False, False, None),
    (2, 1, 8, 64, 32, "fp4", "fp4", False, False, None),
    (2, 3, 4, 128, 16, "fp8-32", "fp8", True, False, torch.bfloat16),
    (4, 1, 8, 64, 16, "fp8", "fp4", True, True, None),
    (2, 2, 4, 32, 16, None, "fp8", False, False, None),
]
_PAGED_SMALL = [
    (2, 2, 2, 32, 8, None, "fp8", False, False, None),
    (3, 1, 2, 64, 8, "fp8", "fp4", True, True, None),
    (2, 1, 2, 64, 16, "fp4", "fp4", False, False, None),
]


def paged_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(70)
    out = []
    for b, next_n, h, d, block_kv, q_fmt, c_fmt, ascend, varlen, logits_dtype in _PAGED_SMALL if small else _PAGED:
        if q_fmt is not None and dtype != (logits_dtype or torch.float32):
            continue  # quantized operands: listed under their logits' precision
        dense = dtype == torch.float64  # every column valid: no -inf for gradcheck
        if varlen:  # runs of 1..3 query tokens per request, one table row per token
            runs = [1 + int(torch.randint(0, 3, (1,), generator=g)) for _ in range(b)]
            lengths = [int(torch.randint(block_kv, 4 * block_kv, (1,), generator=g)) for _ in range(b)]
            cache = build_paged_cache([torch.randn(n, d, generator=g) for n in lengths], block_kv, c_fmt, ascend, g)
            rows = torch.tensor([r for r, n in enumerate(runs) for _ in range(n)])
            lens = torch.cat(
                [
                    (L - n + 1 + torch.arange(n)).clamp(min=0) if not dense else torch.full((n,), L)
                    for L, n in zip(lengths, runs)
                ]
            )
            if dense:
                lens = torch.full_like(lens, min(lengths))
            table, indices, context = cache.block_table[rows], rows.to(torch.int32), lens.view(-1, 1)
            per_row = [cache.values[r] for r in rows.tolist()]
        else:
            lengths = [int(torch.randint(block_kv, 4 * block_kv, (1,), generator=g)) for _ in range(b)]
            if dense:
                lengths = [lengths[0]] * b
            cache = build_paged_cache([torch.randn(n, d, generator=g) for n in lengths], block_kv, c_fmt, ascend, g)
            context = torch.stack(
                [
                    torch.cat([torch.randint(0, L + 1, (next_n - 1,), generator=g), torch.tensor([L])])
                    if not dense
                    else torch.full((next_n,), L)
                    for L in lengths
                ]
            )
            table, indices = cache.block_table, None
            per_row = [cache.values[r // next_n] for r in range(b * next_n)]
        rows_q = context.shape[0]
        q_hp = torch.randn(rows_q, context.shape[1], h, d, generator=g)
        w = torch.rand(rows_q * context.shape[1], h, generator=g) / h**0.5
        if q_fmt is None:
            q, q_sf = q_hp.to(dtype), None
            w = w.to(dtype)
        else:
            q, q_sf = quantize(q_hp, q_fmt)
        max_len = int(context.max()) + (0 if dense else 3)
        q = q.to(device)
        if q_fmt is None:
            q.requires_grad_(requires_grad)
        w = w.to(device).requires_grad_(requires_grad)
        args = (
            q,
            None if q_sf is None else q_sf.to(device),
            cache.cache.to(device),
            w,
            context.to(torch.int32).to(device),
            table.to(device),
            max_len,
            None if indices is None else indices.to(device),
            ascend,
            logits_dtype,
        )
        name = f"B{rows_q} next_n{context.shape[1]} H{h} D{d} block{block_kv} {q_fmt or dtype} x {c_fmt}"
        name += (" ascend" if ascend else "") + (" varlen" if varlen else "")
        sample = SampleInput(args, name)
        sample.kv_values = per_row  # the reference's fp64 KV tokens of each query row
        out.append(sample)
    return out


# The fp64 KV tokens behind each sample's cache, keyed by the cache's bytes (the harness hands references CPU
# copies): the reference reads the values the quantizers produced, never the cache bytes themselves.
_PAGED_VALUES: dict[bytes, list[torch.Tensor]] = {}


def _cache_key(cache: torch.Tensor) -> bytes:
    return cache.detach().cpu().contiguous().numpy().tobytes()


def paged_reference(
    q,
    q_sf,
    kv_cache,
    weights,
    context_lens,
    block_table,
    max_context_len,
    indices,
    ascend_kv_layout,
    logits_dtype,
):
    per_row = _PAGED_VALUES[_cache_key(kv_cache)]
    qd = dequantized(q, q_sf)
    qd = qd.reshape(-1, qd.shape[2], qd.shape[3])
    lens = context_lens.flatten().tolist()
    out = torch.full((qd.shape[0], max_context_len), float("-inf"), dtype=torch.float64)
    for r, n in enumerate(lens):
        scores = torch.einsum("hd,jd->hj", qd[r], per_row[r][:n]).relu()
        out[r, :n] = torch.einsum("hj,h->j", scores, weights[r].double())
    return out


def _paged_samples_registered(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    samples = paged_samples(device, dtype, requires_grad, small)
    for s in samples:
        _PAGED_VALUES[_cache_key(s.args[2])] = s.kv_values
    return samples


def paged_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(71)
    cache = build_paged_cache([torch.randn(20, 64, generator=g), torch.randn(9, 64, generator=g)], 16, "fp8", False, g)
    q = torch.randn(2, 1, 4, 64).to(torch.float8_e4m3fn)
    w = torch.rand(2, 4)
    lens = torch.tensor([[20], [9]], dtype=torch.int32)

    def call(**kw):
        args = dict(
            q=q,
            q_sf=None,
            kv_cache=cache.cache,
            weights=w,
            context_lens=lens,
            block_table=cache.block_table,
            max_context_len=24,
            indices=None,
            ascend_kv_layout=False,
            logits_dtype=None,
        )
        return tuple((args | kw).values())

    bad_table = cache.block_table.clone()
    bad_table[0, 1] = 99
    return [
        BadInput(
            call(block_table=bad_table),
            r"argument 'block_table' values: expected physical block ids in \[0, num_blocks=5\), "
            r"got block_table\[0, 1\]=99",
            "block id out of range",
            data_dependent=True,
        ),
        BadInput(
            call(context_lens=torch.tensor([[25], [9]], dtype=torch.int32)),
            r"argument 'context_lens' values: expected 0 <= context_lens\[b, t\] <= min\(max_context_len=24",
            "length > max_context_len",
            data_dependent=True,
        ),
        BadInput(call(context_lens=lens.flatten()), r"argument 'context_lens' rank: expected 2-D", "1-D lens"),
        BadInput(
            call(q=torch.randn(2, 1, 4, 48).to(torch.float8_e4m3fn)),
            r"argument 'kv_cache' size\(3\) \(bytes per token\): expected D \+ 4 \(FP8\) or D/2 \+ 4",
            "D",
        ),
        BadInput(
            call(ascend_kv_layout=True),
            r"argument 'kv_cache' size\(3\) \(bytes per token\): expected D \+ D/32",
            "layout mismatch",
        ),
        BadInput(
            call(
                q=torch.randn(2, 2, 4, 64).to(torch.float8_e4m3fn),
                weights=torch.rand(4, 4),
                context_lens=lens.repeat(1, 2),
                indices=torch.zeros(2, dtype=torch.int32),
            ),
            r"argument 'indices' value: expected None unless next_n == 1",
            "varlen with next_n 2",
        ),
        BadInput(
            call(indices=torch.zeros(2, dtype=torch.int32)),
            r"argument 'block_table' values: expected equal rows for query tokens of one request",
            "varlen run with different tables",
            data_dependent=True,
        ),
        BadInput(
            call(weights=torch.rand(2, 3)), r"argument 'weights' shape: expected \[2, 4\] \(B \* next_n, H\)", "weights"
        ),
        BadInput(
            call(block_table=cache.block_table.long()),
            r"argument 'block_table' dtype: expected torch.int32",
            "table dtype",
        ),
    ]


# ---- metadata ----


def metadata_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(80)
    lens = torch.randint(0, 3000, (7, 2), generator=g, dtype=torch.int32)
    varlen = torch.randint(100, 2000, (6, 1), generator=g, dtype=torch.int32)
    ids = torch.tensor([0, 0, 1, 2, 2, 2], dtype=torch.int32)
    return [
        SampleInput((lens.to(device), 64, 8, None), "B7 next_n2 8 SMs"),
        SampleInput((varlen.to(device), 64, 4, ids.to(device)), "varlen 3 requests 4 SMs"),
        SampleInput((torch.zeros(3, 1, dtype=torch.int32, device=device), 32, 5, None), "empty contexts"),
        SampleInput((lens[:1].to(device), 64, 132, None), "more SMs than work"),
    ]


def metadata_reference(context_lens, block_kv, num_sms, indices):
    """Enumerate every work unit as (request, unit within request), then read off each SM's first unit."""
    lens = context_lens.tolist()
    ids = indices.tolist() if indices is not None else list(range(len(lens)))
    starts = [r for r in range(len(lens)) if r == 0 or ids[r] != ids[r - 1]]
    ends = starts[1:] + [len(lens)]
    units = []
    for request, (a, b) in enumerate(zip(starts, ends)):
        per_token = -(-lens[b - 1][-1] // 256)
        units += [(request, u) for u in range(per_token * (b - a))]
    rows = []
    for sm in range(num_sms + 1):
        start = sm * (len(units) // num_sms) + min(sm, len(units) % num_sms)
        rows.append(units[start] if start < len(units) else (len(starts), 0))
    return torch.tensor(rows, dtype=torch.int32)


def metadata_bad_inputs(device) -> list[BadInput]:
    lens = torch.ones(3, 1, dtype=torch.int32)
    return [
        BadInput((lens.flatten(), 64, 8, None), r"argument 'context_lens' rank: expected 2-D", "1-D lens"),
        BadInput((lens, 64, 0, None), r"argument 'num_sms' value: expected a positive integer, got 0", "num_sms"),
        BadInput(
            (lens, 64, 8, torch.zeros(2, dtype=torch.int32)),
            r"argument 'indices' size\(0\) \(B\): expected 3",
            "indices length",
        ),
    ]


# ---- top-k ----


def topk_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(90)
    out = []
    cases = (
        [(6, 20, 5, False), (5, 12, 4, True), (4, 9, 9, False)]
        if small
        else [(16, 64, 8, False), (12, 40, 16, True), (8, 30, 40, False), (0, 10, 4, False)]
    )
    for s, cols, k, compressed in cases:
        if dtype == torch.float64:  # every row has at least topk valid columns: no -inf padding
            ks = (
                torch.randint(0, max(1, cols - k), (s,), generator=g, dtype=torch.int32)
                if not compressed
                else torch.randint(0, 50, (s,), generator=g, dtype=torch.int32)
            )
            ke = ks + k + torch.randint(0, 2, (s,), generator=g, dtype=torch.int32)
            if not compressed:
                ke = ke.clamp(max=cols)
                ks = torch.minimum(ks, ke - k)
        elif compressed:
            ks = torch.randint(0, 100, (s,), generator=g, dtype=torch.int32)
            ke = ks + torch.randint(0, cols + 1, (s,), generator=g, dtype=torch.int32)
        else:
            ks, ke = random_ranges(s, cols, g)
        logits = torch.randn(s, cols, generator=g)
        if dtype != torch.float64:
            logits = (logits * 4).round() / 4  # ties: resolved towards the lower position
        logits = logits.to(dtype).to(device).requires_grad_(requires_grad)
        out.append(
            SampleInput(
                (logits, ks.to(device), ke.to(device), k, compressed), f"S{s} cols{cols} k{k} compressed={compressed}"
            )
        )
    return out


def topk_reference(logits, ks, ke, topk, compressed):
    s = logits.shape[0]
    idx = torch.full((s, topk), -1, dtype=torch.int32)
    val = torch.full((s, topk), float("-inf"), dtype=torch.float64)
    for i in range(s):
        a, b = int(ks[i]), int(ke[i])
        cols = range(0, b - a) if compressed else range(a, b)
        ranked = sorted(cols, key=lambda c: (-float(logits[i, c]), c))[:topk]
        for t, c in enumerate(ranked):
            idx[i, t] = c + a if compressed else c
            val[i, t] = float(logits[i, c])
    return val, idx


def topk_bad_inputs(device) -> list[BadInput]:
    logits = torch.randn(3, 10)
    ks, ke = torch.zeros(3, dtype=torch.int32), torch.full((3,), 10, dtype=torch.int32)
    return [
        BadInput(
            (logits, ks, ke + 1, 4, False),
            r"argument 'ke' values: expected ke\[i\] <= logits.size\(1\)=10",
            "ke beyond columns",
            data_dependent=True,
        ),
        BadInput(
            (logits, ke, ks, 4, False),
            r"argument 'ks' values: expected 0 <= ks\[i\] <= ke\[i\]",
            "ks > ke",
            data_dependent=True,
        ),
        BadInput((logits, ks, ke, 0, False), r"argument 'topk' value: expected a positive integer, got 0", "topk"),
        BadInput((logits.half(), ks, ke, 4, False), r"argument 'logits' dtype: expected torch.bfloat16", "dtype"),
    ]


# ---- logits fused with their top-k ----

# (S, H, D, S_kv, ranges, q format, k format, topk, logits dtype for FP32 samples)
_FUSED_CASES = [
    (24, 8, 32, 40, "causal", None, None, 8, None),
    (16, 4, 64, 64, "cp", None, None, 80, None),  # topk > most ranges: padding
    (20, 8, 64, 48, "causal", "fp8", "fp8-row", 16, None),
    (12, 16, 64, 40, "random", "fp4", "fp4", 5, None),
    (9, 8, 64, 33, "random", "fp8-32", "fp8-32", 7, torch.bfloat16),
    (0, 8, 32, 16, "causal", None, None, 4, None),
]
_FUSED_SMALL = [
    (5, 4, 32, 9, "random", None, None, 3, None),
    (4, 2, 32, 7, "causal", None, None, 9, None),
    (6, 4, 64, 10, "random", "fp8", "fp8-row", 4, None),
]


def fused_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(95)
    out = []
    for s, h, d, s_kv, kind, q_fmt, k_fmt, topk, logits_dtype in _FUSED_SMALL if small else _FUSED_CASES:
        if q_fmt is not None and dtype != (logits_dtype or torch.float32):
            continue
        if dtype == torch.float64:  # every query sees at least topk keys: gradcheck's values never tie or pad
            ks = torch.zeros(s, dtype=torch.int32)
            ke = torch.full((s,), s_kv, dtype=torch.int32)
            topk = min(topk, s_kv)
        else:
            ks, ke = _ranges(kind, s, s_kv, g, dense=False)
        q, q_sf, k, k_sf, w, out_dtype = _operands(
            s, h, d, s_kv, q_fmt, k_fmt, dtype, logits_dtype, g, device, requires_grad
        )
        args = (q, q_sf, k, k_sf, w, ks.to(device), ke.to(device), topk, out_dtype)
        out.append(SampleInput(args, f"S{s} H{h} D{d} S_kv{s_kv} {kind} {q_fmt or dtype}x{k_fmt or dtype} k{topk}"))
    return out


def fused_reference(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype):
    """The fp64 logits' top-k, ranked on the values as the logits dtype holds them (BF16 logits: rounded first, so
    values tied after rounding go to the lower position, as mqa_topk ranks mqa_logits' output)."""
    logits = reference_logits(dequantized(q, q_sf), dequantized(k, k_sf), weights, ks, ke, k.shape[0], False)
    out_dtype = logits_dtype or (torch.float64 if weights.dtype == torch.float64 else weights.dtype)
    ranked = logits.to(out_dtype).double() if out_dtype == torch.bfloat16 else logits
    _, idx = topk_reference(ranked, ks, ke, topk, False)
    valid = idx >= 0
    val = torch.where(valid, logits.gather(1, idx.long().clamp(min=0)), float("-inf"))
    return val, idx


def fused_bad_inputs(device) -> list[BadInput]:
    q, k, w = torch.randn(4, 8, 64), torch.randn(10, 64), torch.rand(4, 8)
    ks, ke = torch.zeros(4, dtype=torch.int32), torch.full((4,), 10, dtype=torch.int32)
    return [
        BadInput(
            (q, None, k, None, w, ks, ke, 0, None), r"argument 'topk' value: expected a positive integer, got 0", "topk"
        ),
        BadInput(
            (q, None, k, None, w, ks, ke + 1, 4, None),
            r"mqa_logits_topk: argument 'ke' values: expected ke\[i\] <= S_kv=10 \(k.size\(0\)\)",
            "ke beyond S_kv",
            data_dependent=True,
        ),
        BadInput(
            (q, None, k.double(), None, w, ks, ke, 4, None),
            r"mqa_logits_topk: argument 'k' dtype: expected torch.float32 \(same as 'q'\), got torch.float64",
            "k dtype",
        ),
        BadInput(
            (q, None, k, None, w[:, :4], ks, ke, 4, None),
            r"mqa_logits_topk: argument 'weights' shape: expected \[4, 8\] \(S, H\)",
            "weights shape",
        ),
    ]


# ---- sparse_mqa_logits / paged_sparse_mqa_logits ----


def candidate_blocks(lo: int, hi: int, sbk: int, nb: int, shift: int, g: torch.Generator, pad: int) -> list[int]:
    """A query's candidate blocks as DeepGEMM's test picks them: every block of ``[lo, hi)`` when they fit, else
    ``nb`` random ones, sorted; the slots past them hold ``pad`` (never read)."""
    first = (lo - shift) // sbk
    blocks = list(range(first, -(-(hi - shift) // sbk))) if hi > lo else []
    if len(blocks) > nb:
        blocks = sorted(blocks[j] for j in torch.randperm(len(blocks), generator=g)[:nb].tolist())
    return blocks + [pad] * (nb - len(blocks))


def _sbk_dividing(n: int) -> int:
    """The largest of 4, 3, 2, 1 dividing ``n``: float64 samples select every token (no -inf columns)."""
    return next(b for b in (4, 3, 2, 1) if n % b == 0)


def sparse_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    """``mqa_logits``' samples with candidate blocks: aligned blocks where every ``ks`` is 0, unaligned otherwise;
    at most 3 blocks a query (some queries keep fewer than their range has), padding INT32_MAX or repeats."""
    g = torch.Generator().manual_seed(80)
    out = []
    for n, sample in enumerate(mqa_logits_samples(device, dtype, requires_grad, small)):
        q, q_sf, k, k_sf, w, ks, ke, _, logits_dtype = sample.args
        s_kv = k.shape[0]
        if dtype == torch.float64:
            sbk = _sbk_dividing(s_kv)
            nb, unaligned = max(1, s_kv // sbk), False
        else:
            sbk, nb = (4, 3) if n % 2 else (8, 2)
            unaligned = bool(ks.any())
        pad = 2**31 - 1 if n % 2 else None
        rows = []
        for a, b in zip(ks.tolist(), ke.tolist()):
            shift = a % sbk if unaligned else 0
            row = candidate_blocks(a, b, sbk, nb, shift, g, 0)
            valid = min(nb, -(-(b - a) // sbk))
            fill = pad if pad is not None else (row[valid - 1] if valid else 0)
            rows.append(row[:valid] + [fill] * (nb - valid))
        bi = torch.tensor(rows, dtype=torch.int32).reshape(len(rows), nb).to(device)
        args = (q, q_sf, k, k_sf, w, ks, ke, bi, sbk, unaligned, logits_dtype)
        out.append(SampleInput(args, f"{sample.name} SBK{sbk} NB{nb}{' unaligned' if unaligned else ''}"))
    return out


def _gather_reference(dense: torch.Tensor, lo, hi, shift, block_indices, sbk: int) -> torch.Tensor:
    """A sparse reference from a dense one (columns = tokens): gathered at each valid column, -inf elsewhere."""
    token, valid = portable.sparse_columns(lo, hi, shift, block_indices.cpu(), sbk)
    cols = torch.where(valid, token, 0).clamp(0, max(dense.shape[1] - 1, 0))
    gathered = dense.gather(1, cols) if dense.shape[1] else torch.zeros(token.shape, dtype=torch.float64)
    return torch.where(valid, gathered, float("-inf"))


def sparse_reference(q, q_sf, k, k_sf, weights, ks, ke, block_indices, sparse_block_kv, unaligned_ks, logits_dtype):
    dense = reference_logits(dequantized(q, q_sf), dequantized(k, k_sf), weights, ks, ke, k.shape[0], False)
    shift = portable.sparse_shift(ks, sparse_block_kv, unaligned_ks)
    return _gather_reference(dense, ks, ke, shift, block_indices, sparse_block_kv)


def sparse_bad_inputs(device) -> list[BadInput]:
    q, k, w = torch.randn(3, 4, 32), torch.randn(40, 32), torch.rand(3, 4)
    ks = torch.tensor([0, 8, 16], dtype=torch.int32)
    ke = torch.tensor([20, 40, 17], dtype=torch.int32)
    bi = torch.tensor([[0, 2], [1, 4], [2, 9]], dtype=torch.int32)

    def call(**kw):
        args = dict(
            q=q,
            q_sf=None,
            k=k,
            k_sf=None,
            weights=w,
            ks=ks,
            ke=ke,
            block_indices=bi,
            sparse_block_kv=8,
            unaligned_ks=False,
            logits_dtype=None,
        )
        return tuple((args | kw).values())

    return [
        BadInput(
            call(block_indices=torch.tensor([[2, 0], [1, 4], [2, 9]], dtype=torch.int32)),
            r"sparse_mqa_logits: argument 'block_indices' values: expected strictly increasing block ids in the "
            r"row's valid slots, got block_indices\[0, 1\]=0 after 2",
            "not increasing",
            data_dependent=True,
        ),
        BadInput(
            call(block_indices=torch.tensor([[0, 2], [0, 4], [2, 9]], dtype=torch.int32)),
            r"argument 'block_indices' values: expected blocks overlapping the row's KV range in its valid slots, "
            r"got block_indices\[1, 0\]=0 \(tokens \[0, 8\)\), range \[8, 40\)",
            "block outside the range",
            data_dependent=True,
        ),
        BadInput(
            call(ks=torch.tensor([0, 8, 13], dtype=torch.int32)),
            r"argument 'ks' values: expected multiples of sparse_block_kv=8 for non-empty ranges",
            "unaligned ks",
            data_dependent=True,
        ),
        BadInput(
            call(ke=torch.tensor([20, 41, 17], dtype=torch.int32)),
            r"sparse_mqa_logits: argument 'ke' values: expected ke\[i\] <= S_kv=40",
            "ke > S_kv",
            data_dependent=True,
        ),
        BadInput(call(block_indices=bi.long()), r"argument 'block_indices' dtype: expected torch.int32", "dtype"),
        BadInput(
            call(block_indices=bi[:2]),
            r"argument 'block_indices' size\(0\) \(S\): expected 3 \(q.size\(0\)\), got 2",
            "rows",
        ),
        BadInput(call(sparse_block_kv=0), r"argument 'sparse_block_kv' value: expected a positive integer", "SBK 0"),
        BadInput(
            call(weights=torch.rand(3, 5)), r"sparse_mqa_logits: argument 'weights' shape: expected \[3, 4\]", "w"
        ),
    ]


def paged_sparse_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    """``paged_mqa_logits``' samples (next_n > 1, varlen runs, both layouts) with candidate logical blocks."""
    g = torch.Generator().manual_seed(81)
    out = []
    for n, sample in enumerate(_paged_samples_registered(device, dtype, requires_grad, small)):
        q, q_sf, cache, w, lens, table, _, _, ascend, logits_dtype = sample.args
        block_kv = cache.shape[1]
        flat = lens.flatten().tolist()
        if dtype == torch.float64:
            sbk, nb = 1, max(flat)
        else:
            sbk, nb = (block_kv // 2, 3) if n % 2 else (block_kv // 4, 4)
        rows = [candidate_blocks(0, L, sbk, nb, 0, g, 2**31 - 1) for L in flat]
        bi = torch.tensor(rows, dtype=torch.int32).reshape(len(rows), nb).to(device)
        args = (q, q_sf, cache, w, lens, table, bi, sbk, ascend, logits_dtype)
        out.append(SampleInput(args, f"{sample.name} SBK{sbk} NB{nb}"))
    return out


def paged_sparse_reference(
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
):
    lens = context_lens.flatten()
    span = max(int(lens.max()) if lens.numel() else 0, 1)
    dense = paged_reference(q, q_sf, kv_cache, weights, context_lens, block_table, span, None, ascend_kv_layout, None)
    zero = torch.zeros_like(lens, dtype=torch.long)
    return _gather_reference(dense, zero, lens, zero, block_indices, sparse_block_kv)


def paged_sparse_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(82)
    cache = build_paged_cache([torch.randn(20, 64, generator=g), torch.randn(9, 64, generator=g)], 16, "fp8", False, g)
    q = torch.randn(2, 1, 4, 64).to(torch.float8_e4m3fn)
    w = torch.rand(2, 4)
    lens = torch.tensor([[20], [9]], dtype=torch.int32)
    bi = torch.tensor([[0, 2], [1, 2]], dtype=torch.int32)

    def call(**kw):
        args = dict(
            q=q,
            q_sf=None,
            kv_cache=cache.cache,
            weights=w,
            context_lens=lens,
            block_table=cache.block_table,
            block_indices=bi,
            sparse_block_kv=8,
            ascend_kv_layout=False,
            logits_dtype=None,
        )
        return tuple((args | kw).values())

    bad_table = cache.block_table.clone()
    bad_table[0, 1] = 99
    return [
        BadInput(
            call(block_table=bad_table),
            r"paged_sparse_mqa_logits: argument 'block_table' values: expected physical block ids in "
            r"\[0, num_blocks=5\), got block_table\[0, 1\]=99",
            "block id out of range",
            data_dependent=True,
        ),
        BadInput(
            call(block_indices=torch.tensor([[0, 2], [1, 3]], dtype=torch.int32)),
            r"argument 'block_indices' values: expected blocks overlapping the row's KV range in its valid slots, "
            r"got block_indices\[1, 1\]=3 \(tokens \[24, 32\)\), range \[0, 9\)",
            "block past the context",
            data_dependent=True,
        ),
        BadInput(
            call(context_lens=torch.tensor([[20], [60]], dtype=torch.int32)),
            r"argument 'context_lens' values: expected context_lens\[b, t\] <= block_table.size\(1\) \* block_kv=",
            "length past the table",
            data_dependent=True,
        ),
        BadInput(
            call(sparse_block_kv=5),
            r"paged_sparse_mqa_logits: argument 'sparse_block_kv' value: expected a divisor of the cache's block_kv=16",
            "SBK not dividing block_kv",
        ),
        BadInput(
            call(block_indices=bi[:1]),
            r"argument 'block_indices' size\(0\) \(B \* next_n\): expected 2 \(q.size\(0\) \* q.size\(1\)\)",
            "rows",
        ),
        BadInput(
            call(ascend_kv_layout=True),
            r"paged_sparse_mqa_logits: argument 'kv_cache' size\(3\) \(bytes per token\): expected D \+ D/32",
            "layout mismatch",
        ),
    ]


SPECS = [
    OpSpec("mqa_logits", mqa_logits_samples, mqa_logits_reference, mqa_logits_bad_inputs, portable.mqa_logits),
    OpSpec(
        "mqa_logits_backward",
        backward_samples,
        backward_reference,
        backward_bad_inputs,
        portable.mqa_logits_backward,
        gradcheck="the gradient op is not differentiable again (no double backward)",
    ),
    OpSpec("paged_mqa_logits", _paged_samples_registered, paged_reference, paged_bad_inputs, portable.paged_mqa_logits),
    OpSpec(
        "paged_mqa_logits_metadata",
        metadata_samples,
        metadata_reference,
        metadata_bad_inputs,
        portable.paged_mqa_logits_metadata,
        dtypes=(torch.float32,),
        gradcheck="integer schedule: nothing to differentiate",
    ),
    OpSpec("mqa_topk", topk_samples, topk_reference, topk_bad_inputs, portable.mqa_topk),
    OpSpec("mqa_logits_topk", fused_samples, fused_reference, fused_bad_inputs, portable.mqa_logits_topk),
    OpSpec("sparse_mqa_logits", sparse_samples, sparse_reference, sparse_bad_inputs, portable.sparse_mqa_logits),
    OpSpec(
        "paged_sparse_mqa_logits",
        paged_sparse_samples,
        paged_sparse_reference,
        paged_sparse_bad_inputs,
        portable.paged_sparse_mqa_logits,
    ),
]
