"""DeepGEMM behind our ops (backends/upstream/deep_gemm), checked against the stand-in ``deep_gemm`` package
(tests/standins/deep_gemm: upstream's signatures, host checks and "panics", its reference math) as DeepGEMM 2.6.1 on
SM90 and SM100 and as DeepGEMM-Ascend 0.1.0, with CPU tensors on the device's chain:

* every family sample and the DeepGEMM-shaped ones below go through the chain: a call that reaches the library
  raises nothing there (no host check, no panic: what the real kernel would refuse never reaches it), is within the
  op's threshold of the fp64 reference and of our C++ kernel, and has our fake's shape, dtype and strides; a call that
  does not reach it is bitwise what the chain gives with the library disabled;
* enough calls reach it (the shapes DeepSeek models use), and each chain's reasons are right;
* what is passed (FP32 scales on SM90, packed FP4 as int8, ``c`` as ``d``, psum layouts);
* bad inputs get our op's words and never reach the library; disabling it restores the other kernels bit for bit;
* a compiled graph and an exported program hold our op and still reach the library at run time;
* mutation: a backend that passed the scales of the wrong rows is caught by the same checks.
"""

from __future__ import annotations

import contextlib
import itertools
from unittest import mock

import pytest
import torch

from tests.chains import labels
from tests.fp8_gemm.specs import SPECS as FP8_SPECS
from tests.fp8_gemm.specs import quantize, quantize_einsum_operand
from tests.gemm.specs import SPECS as GEMM_SPECS
from tests.grouped.specs import SPECS as GROUPED_SPECS
from tests.grouped.specs import _quantize_experts, k_grouped_quantize, psum_layout
from tests.hc_prenorm.specs import SPECS as HC_SPECS
from tests.mqa_logits import specs as mqa
from tests.upstream.standin import installed
from torch_ascend_moe._registry import full_call, with_defaults
from torch_ascend_moe.backends import chain
from torch_ascend_moe.backends.upstream.deep_gemm import fp8_gemm as dg_fp8_gemm
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.harness import SampleInput

LIBRARIES = {"SM90": ("cuda", {"flavor": "cuda", "arch": 9}), "SM100": ("cuda", {"flavor": "cuda", "arch": 10})}
LIBRARIES["Ascend"] = ("npu", {"flavor": "ascend"})
SPECS = {s.name: s for s in (*FP8_SPECS, *GEMM_SPECS, *GROUPED_SPECS, *HC_SPECS, *mqa.SPECS)}
SERVED = {
    "cuda": [
        "fp8_gemm",
        "bf16_gemm",
        "m_grouped_fp8_gemm",
        "m_grouped_bf16_gemm",
        "m_grouped_fp8_gemm_masked",
        "m_grouped_bf16_gemm_masked",
        "k_grouped_fp8_gemm",
        "k_grouped_bf16_gemm",
        "hc_prenorm_gemm",
        "bf16_einsum",
        "mqa_logits",
        "paged_mqa_logits",
        "fp8_einsum",
    ],
    "npu": [
        "fp8_gemm",
        "bf16_gemm",
        "m_grouped_fp8_gemm",
        "m_grouped_bf16_gemm",
        "k_grouped_fp8_gemm",
        "k_grouped_bf16_gemm",
        "fp8_bmm",
        "bf16_bmm",
        "fp8_einsum",
        "bf16_einsum",
    ],
}
CASES = [(lib, op) for lib, (device, _) in LIBRARIES.items() for op in SERVED[device]]
E8M0 = torch.float8_e8m0fnu


def _e8m0(*scales):
    return tuple(s.to(E8M0) for s in scales)


# ---- DeepGEMM-shaped samples (the family samples seldom are: psum alignments of 128/256, gran_k 32, ...) ----------


def _fp8_gemm_samples(lib: str, dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(11)
    out = []
    if lib == "SM90":
        for m, n, k in [(1, 264, 256), (37, 128, 384), (128, 64, 128)]:
            a, sfa, ra = quantize(torch.randn(m, k, generator=g), ("fp8-token", 1, 128, False))
            b, sfb, rb = quantize(torch.randn(n, k, generator=g), ("fp8-block", 128, 128, False))
            out.append(SampleInput((a, sfa, b, sfb, None, ra, rb, 1.0, torch.bfloat16), f"1D2D M{m}N{n}K{k}"))
            b1, sfb1, rb1 = quantize(torch.randn(n, k, generator=g), ("fp8-token", 1, 128, False))
            c = torch.randn(m, n, generator=g)
            out.append(SampleInput((a, sfa, b1, sfb1, c, ra, rb1, 1.0, torch.float32), f"1D1D +c M{m}N{n}K{k}"))
            out.append(SampleInput((a, sfa, b1, sfb1, None, ra, rb1, 1.0, torch.float32), f"1D1D M{m}N{n}K{k}"))
        # near misses: N % 8, c with 1D2D, alpha, an MN-major A
        a, sfa, ra = quantize(torch.randn(16, 256, generator=g), ("fp8-token", 1, 128, False))
        b, sfb, rb = quantize(torch.randn(36, 256, generator=g), ("fp8-block", 128, 128, False))
        out.append(SampleInput((a, sfa, b, sfb, None, ra, rb, 1.0, torch.bfloat16), "miss: N 36"))
        b, sfb, rb = quantize(torch.randn(64, 256, generator=g), ("fp8-block", 128, 128, False))
        c = torch.randn(16, 64, generator=g).bfloat16()
        out.append(SampleInput((a, sfa, b, sfb, c, ra, rb, 1.0, torch.bfloat16), "miss: 1D2D with c"))
        out.append(SampleInput((a, sfa, b, sfb, None, ra, rb, 0.5, torch.bfloat16), "miss: alpha"))
        out.append(SampleInput((a.t().contiguous().t(), sfa, b, sfb, None, ra, rb, 1.0, None), "miss: MN-major A"))
        return out
    gk = 128 if lib == "SM100" else 32
    fmts = [("fp8-token", 1, gk, True), ("fp8-block", gk, gk, True), ("fp4", 1, 32, True)]
    for (m, n, k), (fa, fb), with_c, alpha in zip(
        [(1, 264, 256), (37, 128, 256), (64, 64, 512), (5, 16, 256)],
        [(fmts[0], fmts[1]), (fmts[0], fmts[0]), (fmts[2], fmts[2]), (fmts[0], fmts[2])],
        [False, True, False, True],
        [1.0, 1.0, 1.0, 0.5 if lib == "Ascend" else 1.0],
    ):
        a, sfa, ra = quantize(torch.randn(m, k, generator=g), fa)
        b, sfb, rb = quantize(torch.randn(n, k, generator=g), fb)
        sfa, sfb = _e8m0(sfa, sfb)
        c = torch.randn(m, n, generator=g).to(dtype) if with_c else None
        out.append(SampleInput((a, sfa, b, sfb, c, ra, rb, alpha, dtype), f"M{m}N{n}K{k} {fa[0]} x {fb[0]}"))
    a, sfa, ra = quantize(torch.randn(8, 256, generator=g), fmts[0])
    b, sfb, rb = quantize(torch.randn(16, 256, generator=g), fmts[0])
    out.append(SampleInput((a, sfa, b, sfb, None, ra, rb, 1.0, dtype), "miss: FP32 scales"))
    return out


def _bf16_gemm_samples(lib: str, dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(12)
    out = []
    shapes = [(1, 64, 128, False, False), (33, 136, 256, True, True), (64, 64, 64, False, True)]
    for m, n, k, mn_major, with_c in shapes:
        a = torch.randn(m, k, generator=g).bfloat16()
        b = torch.randn(n, k, generator=g).bfloat16()
        if mn_major:
            b = b.t().contiguous().t()
        c = torch.randn(m, n, generator=g).to(dtype) if with_c else None
        alpha = 0.75 if lib == "Ascend" and with_c else 1.0
        out.append(SampleInput((a, b, c, alpha, dtype), f"M{m}N{n}K{k}{' bT' if mn_major else ''}"))
    a = torch.randn(8, 64, generator=g).bfloat16()
    out.append(SampleInput((a, torch.randn(12, 64, generator=g).bfloat16(), None, 1.0, dtype), "miss: N 12 (TMA)"))
    out.append(SampleInput((a.half(), a.half(), None, 1.0, None), "miss: FP16"))
    return out


def _alignment(lib: str) -> int:
    return 128 if lib != "Ascend" else 256


def _m_grouped_fp8_samples(lib: str, dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(13)
    alignment = _alignment(lib)
    gk = 32 if lib == "Ascend" else 128
    out_dtype = torch.bfloat16 if lib != "Ascend" else dtype
    out = []
    fmts = [(("fp8-token", 1, gk, lib != "SM90"), ("fp8-block", gk, gk, lib != "SM90"))]
    if lib != "SM90":
        fmts.append((("fp8-token", 1, gk, True), ("fp4", 1, 32, True)))
    for counts, (fa, fb) in itertools.product([[5, 0, 130, 3], [0, 200]], fmts):
        layout, rows = psum_layout(counts, alignment)
        x = torch.randn(rows, 256, generator=g)
        a, sfa, ra = quantize(x, fa)
        b, sfb, rb = _quantize_experts(torch.randn(len(counts), 64, 256, generator=g), fb)
        if lib != "SM90":
            sfa, sfb = _e8m0(sfa, sfb)
        args = (a, sfa, b, sfb, layout, True, alignment, ra, rb, out_dtype)
        out.append(SampleInput(args, f"psum {counts} {fa[0]} x {fb[0]}"))
    a, sfa, b, sfb, layout, *_ = out[0].args
    out.append(SampleInput((a, sfa, b, sfb, layout, True, 1, out[0].args[7], out[0].args[8], out_dtype), "miss: 1"))
    return out


def _m_grouped_bf16_samples(lib: str, dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(14)
    alignment = _alignment(lib)
    out = []
    for counts in ([5, 0, 130, 3], [0, 200]):
        layout, rows = psum_layout(counts, alignment)
        a = torch.randn(rows, 128, generator=g).bfloat16()
        b = torch.randn(len(counts), 64, 128, generator=g).bfloat16()
        out_dtype = torch.bfloat16 if lib != "Ascend" else dtype
        out.append(SampleInput((a, b, layout, True, alignment, out_dtype), f"psum {counts}"))
    return out


def _masked_fp8_samples(lib: str, dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(15)
    gk, ue8m0 = (128, lib == "SM100")
    a, sfa, ra = _quantize_experts(torch.randn(3, 40, 256, generator=g), ("fp8-token", 1, gk, ue8m0))
    b, sfb, rb = _quantize_experts(torch.randn(3, 64, 256, generator=g), ("fp8-block", 128, gk, ue8m0))
    if ue8m0:
        sfa, sfb = _e8m0(sfa, sfb)
    masked = torch.tensor([40, 0, 17], dtype=torch.int32)
    return [SampleInput((a, sfa, b, sfb, masked, ra, rb, torch.bfloat16), "masked [40, 0, 17]")]


def _masked_bf16_samples(lib: str, dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(16)
    a = torch.randn(3, 40, 128, generator=g).bfloat16()
    b = torch.randn(3, 64, 128, generator=g).bfloat16()
    masked = torch.tensor([3, 40, 0], dtype=torch.int32)
    return [SampleInput((a, b, masked, torch.bfloat16), "masked [3, 40, 0]")]


def _k_grouped_fp8_samples(lib: str, dtype) -> list[SampleInput]:
    """psum layouts at the library's alignment with an empty group and a ragged one, gran_k 128 and 32 (Ascend: remapped
    to its 32-row blocks by absolute position), E8M0 scales, ``c`` or not; and FP32 scales (a miss)."""
    g = torch.Generator().manual_seed(17)
    align = 256 if lib == "Ascend" else 128
    out = []
    for counts, gran_k, with_c in [([130, 0, 40], 128, False), ([64, 200], 32, True), ([300, 45, 0, 70], 64, True)]:
        layout, rows = psum_layout(counts, align)
        a, sfa = k_grouped_quantize(torch.randn(rows, 64, generator=g), layout, align, gran_k, True)
        b, sfb = k_grouped_quantize(torch.randn(rows, 32, generator=g), layout, align, gran_k, True)
        c = (10 * torch.randn(len(counts), 64, 32, generator=g)).to(dtype) if with_c else None
        (sfa8,), (sfb8,) = _e8m0(sfa), _e8m0(sfb)
        args = (a, sfa8, b, sfb8, layout, len(counts), align, gran_k, c, dtype)
        out.append(SampleInput(args, f"psum {counts} gran_k {gran_k}{' +c' if with_c else ''}"))
        out.append(SampleInput((a, sfa, b, sfb, layout, len(counts), align, gran_k, c, dtype), "miss: FP32 scales"))
    return out


def _k_grouped_bf16_samples(lib: str, dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(18)
    align = 256 if lib == "Ascend" else 128
    out = []
    for counts, with_c in [([130, 0, 40], False), ([64, 200], True)]:
        layout, rows = psum_layout(counts, align)
        a = torch.randn(rows, 64, generator=g).bfloat16()
        b = torch.randn(rows, 32, generator=g).bfloat16()
        c = torch.randn(len(counts), 64, 32, generator=g) if with_c else None
        out_dtype = torch.float32 if with_c else dtype
        out.append(SampleInput((a, b, layout, len(counts), True, align, c, out_dtype), f"psum {counts}"))
    return out


def _hc_prenorm_samples(lib: str, dtype) -> list[SampleInput]:
    """DeepSeek's mHC shapes scaled down (N 24, K a few 64-blocks, splits or not; N 64 on SM100) and near misses."""
    g = torch.Generator().manual_seed(19)
    out = []
    for m, n, k, splits in [(13, 24, 1024, None), (37, 24, 512, 4), (5, 64, 256, 2), (8, 20, 256, None)]:
        a = torch.randn(m, k, generator=g).bfloat16()
        b = torch.randn(n, k, generator=g) / 32
        out.append(SampleInput((a, b, splits), f"M{m}N{n}K{k} splits={splits}"))
    out.append(SampleInput((torch.randn(4, 256, generator=g), torch.randn(24, 256, generator=g), None), "miss: FP32"))
    return out


def _einsum_samples(lib: str, dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(20)

    def bf16(*shape):
        return torch.randn(*shape, generator=g).bfloat16()

    return [
        SampleInput(("bhr,hdr->bhd", bf16(4, 8, 128), bf16(8, 64, 128), None, 1.0, None), "bhr,hdr->bhd"),
        SampleInput(("bhd,hdr->bhr", bf16(3, 8, 64), bf16(8, 64, 128), None, 1.0, None), "bhd,hdr->bhr"),
        SampleInput(("bmk,bnk->mn", bf16(3, 64, 64), bf16(3, 128, 64), None, 1.0, None), "bmk,bnk->mn BF16"),
        SampleInput(
            ("bmk,bnk->mn", bf16(2, 64, 128), bf16(2, 64, 128), torch.randn(64, 64, generator=g), 1.0, None),
            "bmk,bnk->mn FP32 +c",
        ),
        SampleInput(("bmk,bnk->mn", bf16(2, 32, 64), bf16(2, 64, 64), None, 1.0, None), "miss: M 32"),
        SampleInput(("bhd,bhr->hdr", bf16(4, 8, 64), bf16(4, 8, 32), None, 1.0, None), "bhd,bhr->hdr"),
        SampleInput(
            ("bhr,hdr->bhd", bf16(4, 8, 128), bf16(8, 64, 128), torch.randn(4, 8, 64, generator=g), 0.5, None),
            "bhr,hdr->bhd FP32 +c alpha 0.5",
        ),
    ]


def _mqa_logits_samples(lib: str, dtype) -> list[SampleInput]:
    """The indexer's shapes scaled down: FP8 q and per-token-scaled FP8 k (FP32 and E8M0 scales), heads 32/64 (and
    16 on SM100), FP4 on SM100, DeepGEMM's causal and context-parallel ranges, full and compressed, FP32 and BF16
    logits; near misses (BF16 weights, scaled FP8 q, 8 heads on SM90)."""
    g = torch.Generator().manual_seed(21)
    out = []
    cases = [(32, 64, 96, "causal", "fp8", False, torch.float32), (16, 128, 64, "cp", "fp8", True, torch.bfloat16)]
    if lib == "SM100":
        cases += [(16, 64, 80, "causal", "fp4", True, torch.float32), (8, 128, 40, "random", "fp8", False, None)]
    for heads, d, s_kv, kind, fmt, compressed, logits_dtype in cases:
        s = 12
        ks, ke = mqa._ranges(kind, s, s_kv, g, dense=False)
        q_hp, k_hp = torch.randn(s, heads, d, generator=g), torch.randn(s_kv, d, generator=g)
        if fmt == "fp8":
            (q, q_sf), (k, k_sf) = (q_hp.to(torch.float8_e4m3fn), None), mqa.quantize(k_hp, "fp8-row")
            k_sf = k_sf.to(E8M0) if kind == "cp" else k_sf  # UE8M0 scales too (rounded up: exact powers of two)
        else:
            (q, q_sf), (k, k_sf) = mqa.quantize(q_hp, "fp4"), mqa.quantize(k_hp, "fp4")
            (q_sf,), (k_sf,) = _e8m0(q_sf), _e8m0(k_sf)
        w = torch.rand(s, heads, generator=g) / heads**0.5
        max_seqlen = int((ke - ks).max()) if compressed else 0
        args = (q, q_sf, k, k_sf, w, ks, ke, max_seqlen, logits_dtype)
        out.append(SampleInput(args, f"H{heads} D{d} {kind} {fmt} compressed={compressed} {logits_dtype}"))
    q, _, k, k_sf, w, ks, ke, *_ = out[0].args
    out.append(SampleInput((q, None, k, k_sf, w.bfloat16(), ks, ke, 0, None), "miss: BF16 weights"))
    return out


def _paged_samples(lib: str, dtype) -> list[SampleInput]:
    """Decode shapes: DeepGEMM's cache layout in 64-token pages at permuted physical blocks, FP8 q (SM100: FP4 too),
    next_n 1 and 2, each request's last token the longest; near misses (a longer earlier token, BF16 weights)."""
    g = torch.Generator().manual_seed(22)
    out = []
    cases = [(3, 2, 32, 64, "fp8"), (2, 1, 64, 128, "fp8")] + ([(2, 1, 16, 64, "fp4")] if lib == "SM100" else [])
    for b, next_n, heads, d, fmt in cases:
        lengths = [int(torch.randint(64, 200, (1,), generator=g)) for _ in range(b)]
        cache = mqa.build_paged_cache([torch.randn(n, d, generator=g) for n in lengths], 64, fmt, False, g)
        context = torch.stack(
            [torch.cat([torch.randint(0, n + 1, (next_n - 1,), generator=g), torch.tensor([n])]) for n in lengths]
        ).to(torch.int32)
        q_hp = torch.randn(b, next_n, heads, d, generator=g)
        q, q_sf = mqa.quantize(q_hp, fmt)
        if fmt == "fp4":
            (q_sf,) = _e8m0(q_sf)
        w = torch.rand(b * next_n, heads, generator=g) / heads**0.5
        mqa._PAGED_VALUES[mqa._cache_key(cache.cache)] = [cache.values[r // next_n] for r in range(b * next_n)]
        args = (q, q_sf, cache.cache, w, context, cache.block_table, max(lengths) + 5, None, False, None)
        out.append(SampleInput(args, f"B{b} next_n{next_n} H{heads} D{d} {fmt}"))
    q, q_sf, cache, w, context, table, max_len, *_ = out[0].args
    longer = context.clone()
    longer[0, 0] = longer[0, 1] + 1
    out.append(SampleInput((q, q_sf, cache, w, longer, table, max_len + 1, None, False, None), "miss: order"))
    if lib == "SM100":  # varlen: one query token per row, a request a run of equal indices (its table rows equal)
        lengths, runs = [150, 90, 70], [3, 1, 2]
        cache = mqa.build_paged_cache([torch.randn(n, 64, generator=g) for n in lengths], 64, "fp8", False, g)
        rows = torch.tensor([r for r, n in enumerate(runs) for _ in range(n)])
        lens = torch.cat([length - n + 1 + torch.arange(n) for length, n in zip(lengths, runs)]).to(torch.int32)
        q, q_sf = mqa.quantize(torch.randn(len(rows), 1, 32, 64, generator=g), "fp8")
        w = torch.rand(len(rows), 32, generator=g) / 32**0.5
        mqa._PAGED_VALUES[mqa._cache_key(cache.cache)] = [cache.values[r] for r in rows.tolist()]
        table, indices = cache.block_table[rows], rows.to(torch.int32)
        args = (q, q_sf, cache.cache, w, lens.view(-1, 1), table, max(lengths) + 5, indices, False, None)
        out.append(SampleInput(args, f"varlen B{len(rows)} runs {runs} H32 D64 fp8"))
        later_shorter = lens.clone()
        later_shorter[2] = later_shorter[0] - 1  # the run's last token shorter than its first: the kernel's schedule
        miss = (*args[:4], later_shorter.view(-1, 1), *args[5:])
        out.append(SampleInput(miss, "miss: varlen order"))
    return out


def _fp8_bmm_samples(lib: str, dtype) -> list[SampleInput]:
    """DeepGEMM-Ascend's batched FP8 GEMM: 1x32 / 32x32 UE8M0 recipes, alpha and c."""
    g = torch.Generator().manual_seed(23)
    out = []
    for batch, m, n, k, fb, with_c, alpha in [(3, 17, 64, 128, ("fp8-block", 32, 32, True), False, 1.0)] + [
        (2, 5, 32, 256, ("fp8-token", 1, 32, True), True, 0.5)
    ]:
        parts_a = [quantize(torch.randn(m, k, generator=g), ("fp8-token", 1, 32, True)) for _ in range(batch)]
        parts_b = [quantize(torch.randn(n, k, generator=g), fb) for _ in range(batch)]
        a, sfa = torch.stack([p[0] for p in parts_a]), torch.stack([p[1] for p in parts_a]).to(E8M0)
        b, sfb = torch.stack([p[0] for p in parts_b]), torch.stack([p[1] for p in parts_b]).to(E8M0)
        c = torch.randn(batch, m, n, generator=g).to(dtype) if with_c else None
        args = (a, sfa, b, sfb, c, parts_a[0][2], parts_b[0][2], alpha, dtype)
        out.append(SampleInput(args, f"B{batch} M{m}N{n}K{k} {fb[0]}{' +c' if with_c else ''} alpha={alpha}"))
    return out


def _bf16_bmm_samples(lib: str, dtype) -> list[SampleInput]:
    g = torch.Generator().manual_seed(24)
    a, b = torch.randn(3, 9, 64, generator=g).bfloat16(), torch.randn(3, 32, 64, generator=g).bfloat16()
    c = torch.randn(3, 9, 32, generator=g).to(dtype)
    return [SampleInput((a, b, None, 1.0, dtype), "B3 M9 N32 K64"), SampleInput((a, b, c, 0.75, None), "+c alpha")]


def _fp8_einsum_samples(lib: str, dtype) -> list[SampleInput]:
    """DeepGEMM's FP8 einsums: bhr,hdr->bhd (1x128 x 128x128, SM90's one), and on SM100 bhd,hdr->bhr and the
    per-channel bhd,bhr->hdr accumulated in FP32, with UE8M0 scales."""
    g = torch.Generator().manual_seed(25)
    ue8m0 = lib != "SM90"
    cases = [("bhr,hdr->bhd", [1, 128], [128, 128], {"b": 5, "h": 3, "r": 256, "d": 64}, torch.bfloat16, False)]
    if lib == "SM100":
        cases += [
            ("bhd,hdr->bhr", [1, 128], [128, 128], {"b": 4, "h": 2, "d": 256, "r": 64}, torch.bfloat16, False),
            ("bhd,bhr->hdr", [1, 128], [1, 128], {"b": 256, "h": 2, "d": 24, "r": 40}, torch.float32, True),
        ]
    if lib == "Ascend":  # gran_k 32 (its only one), any power-of-two gran_mn, c and alpha
        cases = [
            ("bhr,hdr->bhd", [1, 32], [32, 32], {"b": 5, "h": 3, "r": 96, "d": 64}, torch.bfloat16, False),
            ("bhd,hdr->bhr", [1, 32], [1, 32], {"b": 4, "h": 2, "d": 64, "r": 32}, torch.float32, True),
            ("bhd,bhr->hdr", [1, 32], [1, 32], {"b": 64, "h": 2, "d": 24, "r": 40}, torch.float32, True),
        ]
    out = []
    for eq, recipe_a, recipe_b, sizes, out_dtype, with_c in cases:
        sa, sb, so = eq[0:3], eq[4:7], eq[9:]
        a, sfa = quantize_einsum_operand(torch.randn([sizes[c] for c in sa], generator=g), sa, so, recipe_a, ue8m0)
        b, sfb = quantize_einsum_operand(torch.randn([sizes[c] for c in sb], generator=g), sb, so, recipe_b, ue8m0)
        if ue8m0:
            sfa, sfb = _e8m0(sfa, sfb)
        c = torch.randn([sizes[x] for x in so], generator=g).to(out_dtype) if with_c else None
        out.append(SampleInput((eq, a, sfa, b, sfb, c, recipe_a, recipe_b, 1.0, out_dtype), f"{eq} {sizes}"))
    return out


EXTRA = {
    "fp8_gemm": _fp8_gemm_samples,
    "bf16_gemm": _bf16_gemm_samples,
    "m_grouped_fp8_gemm": _m_grouped_fp8_samples,
    "m_grouped_bf16_gemm": _m_grouped_bf16_samples,
    "m_grouped_fp8_gemm_masked": _masked_fp8_samples,
    "m_grouped_bf16_gemm_masked": _masked_bf16_samples,
    "k_grouped_fp8_gemm": _k_grouped_fp8_samples,
    "k_grouped_bf16_gemm": _k_grouped_bf16_samples,
    "hc_prenorm_gemm": _hc_prenorm_samples,
    "bf16_einsum": _einsum_samples,
    "mqa_logits": _mqa_logits_samples,
    "paged_mqa_logits": _paged_samples,
    "fp8_bmm": _fp8_bmm_samples,
    "bf16_bmm": _bf16_bmm_samples,
    "fp8_einsum": _fp8_einsum_samples,
}
# How many calls must reach the library per (library, op); SM90's k-grouped kernels need the groups' sizes on the host
# (ks_cpu), a host read our op does not make, so none reaches them.
MIN_REACHED = 2
NOT_SERVED = {("SM90", "k_grouped_fp8_gemm"), ("SM90", "k_grouped_bf16_gemm")}


def _samples(lib: str, op: str) -> list[SampleInput]:
    spec = SPECS[op]
    out = []
    for dtype in spec.dtypes:
        out += spec.sample_inputs("cpu", dtype) + spec.sample_inputs("cpu", dtype, small=True)
        out += EXTRA[op](lib, dtype)
    return out


# ---- checks ------------------------------------------------------------------------------------------------------


def _kernel_calls(library) -> list:
    """The library's GEMM calls in its log (its getters, asked by our chains, left out)."""
    return [c for c in library._standin.CALLS if not c[0].startswith("get_")]


def _outputs(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    return x.dtype == y.dtype and torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(), y.nan_to_num())


_BMM = torch.bmm


def _bmm_on_cpu(a, b, *, out_dtype=None):
    """cuBLAS's ``bmm(out_dtype=float32)`` (the CUDA chain's next kernel for BF16 GEMMs; no CPU kernel in torch) as
    the exact computation it stands for: BF16 products, FP32 sums."""
    return _BMM(a, b) if out_dtype is None else _BMM(a.float(), b.float())


def _check(lib: str, op: str, device: str, library, samples) -> tuple[list[str], int]:
    """(problems, how many samples reached the library) of ``samples`` on ``device``'s chain (on Ascend the torch_npu
    adapters switched off: the library's refusals go to the portable kernels, which run on CPU tensors)."""
    with mock.patch.object(torch, "bmm", _bmm_on_cpu), chain.disabled("torch_npu"):
        return _check_samples(lib, op, device, library, samples)


def _check_samples(lib: str, op: str, device: str, library, samples) -> tuple[list[str], int]:
    spec = SPECS[op]
    problems, reached = [], 0
    for s in samples:
        full = full_call(op, *s.args)
        where = f"{lib} {op}[{s.name}]"
        before = len(_kernel_calls(library))
        try:
            got = _outputs(chain.run(op, device, *full))
        except library._standin.Panic as e:
            problems.append(f"{where}: a call the real kernel would panic on reached it: {e}")
            continue
        except RuntimeError as e:
            if "DeepGEMM stand-in" in str(e):
                problems.append(f"{where}: a call the library refuses reached it: {e}")
                continue
            raise
        if len(_kernel_calls(library)) == before:
            with chain.disabled("deep_gemm"):
                want = _outputs(chain.run(op, device, *full))
            if not all(_same(x, y) for x, y in zip(got, want, strict=True)):
                problems.append(f"{where}: not bitwise the chain without the library")
            continue
        reached += 1
        ours = _outputs(getattr(torch.ops.ascend_moe, op)(*full))  # the C++ kernel
        ref = _outputs(with_defaults(op, spec.reference)(*full))
        for i, (x, o, r) in enumerate(zip(got, ours, ref, strict=True)):
            if (x.shape, x.dtype, x.stride()) != (o.shape, o.dtype, o.stride()):
                problems.append(f"{where} output {i}: {x.shape, x.dtype, x.stride()} != {o.shape, o.dtype, o.stride()}")
            elif x.numel():
                bound = spec.threshold("cpu", x.dtype)  # the stand-in sums in fp64: the CPU's bounds
                if (r == 0).any() and (x[r == 0] != 0).any():
                    problems.append(f"{where} output {i}: rows the op defines as zero are not")
                for what, want in (("fp64", r), ("C++ kernel", o)):
                    finite = torch.isfinite(want)  # -inf (masked logits) exactly where the reference has them
                    same = torch.equal(torch.isfinite(x), finite) and torch.equal(
                        x[~finite].double(), want[~finite].double()
                    )
                    diff = calc_diff(x[finite], want[finite]) if finite.any() else 0.0
                    if not same or not diff < bound:
                        problems.append(f"{where} output {i}: vs {what}: non-finite equal {same}, calc_diff {diff:.3g}")
    return problems, reached


@pytest.mark.parametrize(("lib", "op"), CASES, ids=[f"{lib}-{op}" for lib, op in CASES])
def test_calls_the_library_takes_compute_the_op(lib, op):
    device, config = LIBRARIES[lib]
    with installed("deep_gemm", **config) as library:
        problems, reached = _check(lib, op, device, library, _samples(lib, op))
    assert not problems, "\n".join(problems[:8])
    if (lib, op) in NOT_SERVED:
        assert reached == 0, f"{lib} {op}: {reached} samples reached DeepGEMM"
    else:
        assert reached >= MIN_REACHED, f"{lib} {op}: only {reached} samples reached DeepGEMM"


@pytest.mark.parametrize("device", ["cuda", "npu"])
@chain.disabled("torch_npu")  # its adapters ask torch_npu for the SoC: not here
def test_deep_gemm_comes_first_and_is_missing_here(device):
    for op in SERVED[device]:
        assert labels(op, device)[0].startswith("deep_gemm."), (op, labels(op, device))
        s = SPECS[op].sample_inputs("cpu", torch.bfloat16)[0]
        first = chain.explain(op, device, *s.args)[0]
        assert first.status == "not available" and "deep_gemm is not installed" in first.reason, first


def test_the_other_build_is_not_used():
    """DeepGEMM-Ascend on a CUDA chain (and the CUDA build on an NPU chain) is not available, with the reason."""
    s = SPECS["bf16_gemm"].sample_inputs("cpu", torch.bfloat16)[0]
    with installed("deep_gemm", flavor="ascend"):
        first = chain.explain("bf16_gemm", "cuda", *s.args)[0]
        assert first.status == "not available" and "DeepGEMM-Ascend" in first.reason
    with installed("deep_gemm", flavor="cuda", arch=9):
        first = chain.explain("bf16_gemm", "npu", *s.args)[0]
        assert first.status == "not available" and "not DeepGEMM-Ascend" in first.reason


def test_our_compat_package_is_never_taken_for_the_library(monkeypatch):
    """Code that aliases ``torch_ascend_moe.deep_gemm`` as ``deep_gemm`` (upstream's tests run that way) must not make
    our ops call themselves."""
    import sys

    import torch_ascend_moe.deep_gemm as ours

    monkeypatch.setitem(sys.modules, "deep_gemm", ours)
    chain.refresh()
    try:
        s = SPECS["bf16_gemm"].sample_inputs("cpu", torch.bfloat16)[0]
        first = chain.explain("bf16_gemm", "cuda", *s.args)[0]
        assert first.status == "not available" and "own compat package" in first.reason
    finally:
        chain.refresh()


def test_reasons_name_what_the_library_lacks():
    with installed("deep_gemm", flavor="cuda", arch=9):
        cases = {s.name: s for s in _fp8_gemm_samples("SM90", torch.bfloat16)}
        for name, reason in [
            ("miss: N 36", "N not a multiple of 16 bytes of output (TMA)"),
            ("miss: 1D2D with c", "BF16 without c"),
            ("miss: alpha", "alpha"),
            ("miss: MN-major A", "MN-major"),
        ]:
            step = chain.explain("fp8_gemm", "cuda", *cases[name].args)[0]
            assert step.status == "refused" and reason in step.reason, (name, step)
    with installed("deep_gemm", flavor="cuda", arch=10):
        s = {s.name: s for s in _fp8_gemm_samples("SM100", torch.bfloat16)}["miss: FP32 scales"]
        step = chain.explain("fp8_gemm", "cuda", *s.args)[0]
        assert step.status == "refused" and "powers of two" in step.reason
    with installed("deep_gemm", flavor="cuda", arch=9):
        s = _m_grouped_fp8_samples("SM90", torch.bfloat16)[-1]
        step = chain.explain("m_grouped_fp8_gemm", "cuda", *s.args)[0]
        assert step.status == "refused" and "aligned to 128" in step.reason


def test_what_is_passed():
    """SM90 gets FP32 scales kept FP32 and ``c`` as ``d`` for the 1D1D kernel; SM100 packed FP4 as int8 and UE8M0
    scales widened to FP32 for its cast; grouped calls a contiguous int32 psum layout."""
    sm90 = {s.name: s for s in _fp8_gemm_samples("SM90", torch.bfloat16)}
    with installed("deep_gemm", flavor="cuda", arch=9) as dg:
        chain.run("fp8_gemm", "cuda", *sm90["1D1D +c M1N264K256"].args)
        name, call = dg._standin.CALLS[-1]
        assert name == "fp8_fp4_gemm_nt" and call["disable_ue8m0_cast"] is True
        (_, sfa), d, c = call["a"], call["d"], call["c"]
        assert sfa[0] == torch.float32 and c[3] == d[3] and d[2] == (264, 1)
    sm100 = {s.name: s for s in _fp8_gemm_samples("SM100", torch.bfloat16)}
    with installed("deep_gemm", flavor="cuda", arch=10) as dg:
        chain.run("fp8_gemm", "cuda", *sm100["M64N64K512 fp4 x fp4"].args)
        _, call = dg._standin.CALLS[-1]
        assert call["a"][0][0] == torch.int8 and call["a"][1][0] == torch.float32
        assert call["disable_ue8m0_cast"] is False
        chain.run("m_grouped_fp8_gemm", "cuda", *_m_grouped_fp8_samples("SM100", torch.bfloat16)[0].args)
        name, call = dg._standin.CALLS[-1]
        layout = call["grouped_layout"]
        assert name == "m_grouped_fp8_fp4_gemm_nt_contiguous" and call["use_psum_layout"] is True
        assert layout[0] == torch.int32 and layout[2] == (1,)


@pytest.mark.parametrize("lib", list(LIBRARIES))
def test_bad_inputs_never_reach_the_library(lib):
    device, config = LIBRARIES[lib]
    with installed("deep_gemm", **config) as dg, chain.disabled("torch_npu"):
        for op in SERVED[device]:
            for bad in SPECS[op].bad_inputs("cpu"):
                with pytest.raises(bad.error, match=bad.match):
                    chain.run(op, device, *bad.args)
            assert not _kernel_calls(dg), (op, _kernel_calls(dg))


def test_disabling_restores_the_other_kernels_bit_for_bit(monkeypatch):
    samples = _fp8_gemm_samples("SM90", torch.bfloat16)
    without = [chain.run("fp8_gemm", "cuda", *s.args) for s in samples]
    with installed("deep_gemm", flavor="cuda", arch=9) as dg:
        for how in ("context", "environment"):
            with contextlib.ExitStack() as stack:
                if how == "context":
                    stack.enter_context(chain.disabled("deep_gemm"))
                else:
                    monkeypatch.setenv(chain.ENV, "fp8_gemm:deep_gemm")
                got = [chain.run("fp8_gemm", "cuda", *s.args) for s in samples]
            monkeypatch.delenv(chain.ENV, raising=False)
            assert all(torch.equal(x, y) for x, y in zip(got, without, strict=True)), how
        assert not _kernel_calls(dg)


def test_compiled_and_exported_programs_hold_our_op_and_reach_the_library(tmp_path):
    s = {s.name: s for s in _fp8_gemm_samples("SM90", torch.bfloat16)}["1D2D M37N128K384"]
    a, sfa, b, sfb, c, ra, rb, alpha, dtype = s.args

    class Layer(torch.nn.Module):
        def forward(self, a, sfa, b, sfb):
            return torch.ops.ascend_moe.fp8_gemm(a, sfa, b, sfb, None, ra, rb, 1.0, dtype) * 2

    eager = Layer()(a, sfa, b, sfb)
    program = torch.export.export(Layer(), (a, sfa, b, sfb))
    assert any(n.target is torch.ops.ascend_moe.fp8_gemm.default for n in program.graph.nodes)
    path = tmp_path / "layer.pt2"
    torch.export.save(program, path)
    loaded = torch.export.load(path)
    with installed("deep_gemm", flavor="cuda", arch=9) as dg, chain.on_cpu("cuda"):
        torch._dynamo.reset()
        compiled = torch.compile(Layer(), fullgraph=True, backend="aot_eager")(a, sfa, b, sfb)
        reached_compiled = len(_kernel_calls(dg))
        exported = loaded.module()(a, sfa, b, sfb)
        reached_exported = len(_kernel_calls(dg)) - reached_compiled
    assert reached_compiled >= 1 and reached_exported == 1
    for out in (compiled, exported):
        assert calc_diff(out, eager) < 1e-5


_MUTATIONS = {
    # the scales of the wrong rows: values off
    "scales of reversed rows": ("scales_as_fp32", lambda real: lambda sf: real(sf).flip(0).contiguous(), "calc_diff"),
    # A handed over transposed (an MN-major view): SM90's FP8 kernels refuse it
    "a transposed operand": ("as_library_fp4", lambda real: lambda t: real(t).t().contiguous().t(), "refuses"),
}


@pytest.mark.parametrize("mutation", list(_MUTATIONS))
def test_a_wrong_handover_is_caught(mutation):
    """Mutation check: a backend that handed the library the wrong scale rows, or an operand in another layout,
    fails the checks of the samples that reach it."""
    name, wrap, symptom = _MUTATIONS[mutation]
    samples = [s for s in _fp8_gemm_samples("SM90", torch.bfloat16) if s.name.startswith("1D")]
    with installed("deep_gemm", flavor="cuda", arch=9) as dg:
        problems, _ = _check("SM90", "fp8_gemm", "cuda", dg, samples)
        assert not problems, problems
        with mock.patch.object(dg_fp8_gemm, name, wrap(getattr(dg_fp8_gemm, name))):
            problems, _ = _check("SM90", "fp8_gemm", "cuda", dg, samples)
    assert problems and all(symptom in p for p in problems), problems
