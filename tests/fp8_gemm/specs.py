"""Sample inputs, bad inputs and the harness specs of the fp8_gemm family (fp8_gemm, fp8_bmm, fp8_einsum).

Samples are quantized from random FP32 data with the reference quantizers, in every supported
combination: FP8 x FP8 (1x128 / 128x128 blocks, and 1x128 / 1x128 with UE8M0 scales), FP8 x FP4 and
FP4 x FP4 (1x32 UE8M0, MXFP4-like), MN-major FP8 A, ``float8_e8m0fnu`` scales, accumulation and alpha.
``dtype`` is the output dtype.
"""

from __future__ import annotations

import itertools

import torch

from torch_ascend_moe import quant
from torch_ascend_moe.backends.portable import fp8_gemm as portable
from torch_ascend_moe.quant.reference import dequantized
from torch_ascend_moe.testing.harness import FP8_TENSOR_CORES, BadInput, OpSpec, SampleInput

# (name, a format, b format): format = (kind, gran_mn, gran_k, use_ue8m0)
_FORMATS = [
    ("fp8-1x128 x fp8-128x128", ("fp8-token", 1, 128, False), ("fp8-block", 128, 128, False)),
    ("fp8-1x128 x fp8-1x128 ue8m0", ("fp8-token", 1, 128, True), ("fp8-token", 1, 128, True)),
    ("fp8-1x128 x fp4-1x32", ("fp8-token", 1, 128, True), ("fp4", 1, 32, True)),
    ("fp4-1x32 x fp4-1x32", ("fp4", 1, 32, True), ("fp4", 1, 32, True)),
]


def quantize(x: torch.Tensor, fmt) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(data, FP32 scales, recipe) of ``x`` in format ``fmt``."""
    kind, gmn, gk, ue8m0 = fmt
    if kind == "fp4":
        data, sf = quant.per_token_cast_to_fp4(x, ue8m0, gran_k=gk)
        return data.view(torch.uint8), sf, [gmn, gk]
    cast = quant.per_block_cast_to_fp8 if kind == "fp8-block" else quant.per_token_cast_to_fp8
    data, sf = cast(x, ue8m0, gk)
    return data, sf, [gmn, gk]


_SHAPES = [(1, 576, 512), (128, 264, 256), (33, 129, 384), (0, 16, 128), (8, 24, 0)]
_SHAPES_SMALL = [(1, 8, 128), (5, 7, 256), (6, 12, 128), (0, 4, 128), (3, 5, 0)]


def fp8_gemm_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(7)
    variants = itertools.cycle(
        [(False, False, 1.0, False), (True, True, 0.5, False), (False, True, -1.5, True), (True, False, 2.0, True)]
    )
    samples = []
    for (m, n, k), (name, fa, fb), (a_mn_major, with_c, alpha, e8m0) in zip(
        _SHAPES_SMALL if small else _SHAPES, itertools.cycle(_FORMATS), variants
    ):
        x = torch.randn(m, k, generator=g)
        w = torch.randn(n, k, generator=g)
        a, sfa, recipe_a = quantize(x, fa)
        b, sfb, recipe_b = quantize(w, fb)
        if a_mn_major and a.dtype == torch.float8_e4m3fn:
            a = a.t().contiguous().t()
        if e8m0 and fa[3] and fb[3]:
            sfa, sfb = sfa.to(torch.float8_e8m0fnu), sfb.to(torch.float8_e8m0fnu)
        c = None
        if with_c:
            c = (torch.randn(m, n, generator=g) * 4).to(dtype).detach().requires_grad_(requires_grad)
        args = tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in (a, sfa, b, sfb))
        c = None if c is None else c.to(device).detach().requires_grad_(requires_grad)
        label = f"M{m}N{n}K{k} {name}{' aT' if a_mn_major else ''}{' +c' if with_c else ''}{' e8m0' if e8m0 else ''}"
        samples.append(SampleInput((*args, c, recipe_a, recipe_b, alpha, dtype), label))
    return samples


def fp8_gemm_reference(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    """fp64 product of the exactly dequantized operands."""
    a64 = dequantized(a, sfa, recipe_a).double()
    b64 = dequantized(b, sfb, recipe_b).double()
    out = alpha * (a64 @ b64.T)
    return out if c is None else out + c.double()


def fp8_gemm_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(8)
    a, sfa, _ = quantize(torch.randn(4, 256, generator=g), _FORMATS[0][1])
    b, sfb, _ = quantize(torch.randn(8, 256, generator=g), _FORMATS[0][2])
    b4, sfb4, _ = quantize(torch.randn(8, 256, generator=g), ("fp4", 1, 32, True))
    a4, sfa4, _ = quantize(torch.randn(4, 256, generator=g), ("fp4", 1, 32, True))
    r1, r2 = [1, 128], [128, 128]
    return [
        BadInput(
            (a.bfloat16(), sfa, b, sfb, None, r1, r2, 1.0, None), r"argument 'a' dtype: expected torch.float8", "bf16 a"
        ),
        BadInput(
            (a, sfa[:, :1], b, sfb, None, r1, r2, 1.0, None), r"argument 'sfa' shape: expected \[4, 2\]", "sfa shape"
        ),
        BadInput(
            (a, sfa, b, sfb, None, r1, [128, 96], 1.0, None),
            r"argument 'b' K: expected a multiple of gran_k=96",
            "K % gran_k",
        ),
        BadInput((a4, sfa4, b, sfb, None, [1, 32], r2, 1.0, None), r"FP4 x FP8 is unsupported", "fp4 x fp8"),
        BadInput((a, sfa, b, sfb.view(torch.int32), None, r1, r2, 1.0, None), r"argument 'sfb' dtype", "packed sf"),
        BadInput((a, sfa, b4, sfb4, None, r1, [1, 128], 1.0, None), r"argument 'sfb' shape", "recipe vs sf"),
        BadInput((a, sfa, b[:, :128], sfb[:, :1], None, r1, r2, 1.0, None), r"argument 'b' K: expected 256", "K"),
        BadInput((a, sfa, b, sfb, None, [0, 128], r2, 1.0, None), r"argument 'recipe_a' value", "recipe"),
        BadInput((a, sfa, b, sfb, None, r1, r2, 1.0, torch.float16), r"argument 'out_dtype' value", "out_dtype"),
        BadInput((a, sfa, b, sfb, torch.zeros(4, 8), r1, r2, 1.0, torch.bfloat16), r"argument 'c' dtype", "c dtype"),
        BadInput((a, sfa, b.to("meta"), sfb, None, r1, r2, 1.0, None), r"argument 'b' device", "device"),
    ]


_BMM_SHAPES = [(2, 1, 24, 256), (3, 33, 129, 384), (0, 2, 3, 128), (2, 4, 6, 0)]
_BMM_SHAPES_SMALL = [(2, 1, 8, 128), (3, 5, 7, 256), (0, 2, 3, 128), (2, 3, 5, 0)]


def fp8_bmm_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    """One sample per (shape, format); groups are quantized one by one and stacked."""
    g = torch.Generator().manual_seed(9)
    samples = []
    for i, ((groups, m, n, k), (name, fa, fb)) in enumerate(
        zip(_BMM_SHAPES_SMALL if small else _BMM_SHAPES, itertools.cycle(_FORMATS))
    ):
        # At least one group is quantized so that a zero-group sample still has well-formed shapes.
        pairs = [
            (quantize(torch.randn(m, k, generator=g), fa), quantize(torch.randn(n, k, generator=g), fb))
            for _ in range(max(groups, 1))
        ]
        a, sfa, b, sfb = (torch.stack([p[j][t] for p in pairs])[:groups] for j, t in ((0, 0), (0, 1), (1, 0), (1, 1)))
        recipe_a, recipe_b = list(fa[1:3]), list(fb[1:3])
        c = (torch.randn(groups, m, n, generator=g) * 4).to(dtype) if i % 2 else None
        args = tuple(t.to(device) for t in (a, sfa, b, sfb))
        c = None if c is None else c.to(device).requires_grad_(requires_grad)
        alpha = 1.0 if i % 3 else -0.5
        samples.append(SampleInput((*args, c, recipe_a, recipe_b, alpha, dtype), f"G{groups}M{m}N{n}K{k} {name}"))
    return samples


def fp8_bmm_reference(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    out = alpha * (dequantized(a, sfa, recipe_a).double() @ dequantized(b, sfb, recipe_b).double().mT)
    return out if c is None else out + c.double()


def fp8_bmm_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(10)
    (a, sfa, _), (b, sfb, _) = (
        quantize(torch.randn(r, 256, generator=g), f) for r, f in ((4, _FORMATS[0][1]), (8, _FORMATS[0][2]))
    )
    a3, sfa3, b3, sfb3 = (t.unsqueeze(0).expand(2, *t.shape).contiguous() for t in (a, sfa, b, sfb))
    r1, r2 = [1, 128], [128, 128]
    return [
        BadInput((a, sfa, b3, sfb3, None, r1, r2, 1.0, None), r"argument 'a' rank: expected 3-D \[G, MN, K\]", "2-D a"),
        BadInput(
            (a3, sfa3, b3[:1], sfb3[:1], None, r1, r2, 1.0, None),
            r"argument 'b' size\(0\) \(batch\): expected 2",
            "batch",
        ),
        BadInput(
            (a3, sfa3[:, :, :1], b3, sfb3, None, r1, r2, 1.0, None),
            r"argument 'sfa' shape: expected \[2, 4, 2\]",
            "sfa",
        ),
        BadInput(
            (a3, sfa3, b3, sfb3, torch.zeros(2, 4, 7), r1, r2, 1.0, torch.float32), r"argument 'c' shape", "c shape"
        ),
    ]


# (equation, a letters' recipe_a, recipe_b, use_ue8m0, shapes (letter -> size))
_EINSUM_CASES = [
    ("bhr,hdr->bhd", [1, 128], [128, 128], False, {"b": 5, "h": 3, "r": 256, "d": 130}),
    ("bhd,hdr->bhr", [1, 128], [128, 128], True, {"b": 4, "h": 2, "d": 256, "r": 72}),
    ("bhd,bhr->hdr", [1, 128], [1, 128], False, {"b": 256, "h": 2, "d": 24, "r": 40}),
    ("bhr,hdr->bhd", [1, 32], [1, 32], True, {"b": 3, "h": 2, "r": 64, "d": 20}),
]
_EINSUM_CASES_SMALL = [
    ("bhr,hdr->bhd", [1, 128], [128, 128], False, {"b": 2, "h": 2, "r": 128, "d": 6}),
    ("bhd,hdr->bhr", [1, 32], [32, 32], True, {"b": 3, "h": 1, "d": 64, "r": 5}),
    ("bhd,bhr->hdr", [1, 128], [1, 128], False, {"b": 128, "h": 2, "d": 3, "r": 4}),
]


def quantize_einsum_operand(x: torch.Tensor, subs: str, out: str, recipe, use_ue8m0: bool):
    """FP8 data and FP32 scales of an einsum operand: blocks of gran_mn along its output letter and gran_k
    along the contracted one, per index of ``h`` (the scales keep the operand's subscripts)."""
    h = subs.index("h")
    letters = [c for c in subs if c != "h"]
    block = [recipe[0] if c in out else recipe[1] for c in letters]
    parts = [quant.block_cast_to_fp8(x.select(h, i), block, use_ue8m0) for i in range(x.shape[h])]
    return torch.stack([p[0] for p in parts], dim=h), torch.stack([p[1] for p in parts], dim=h)


def fp8_einsum_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(11)
    samples = []
    for i, (eq, recipe_a, recipe_b, ue8m0, sizes) in enumerate(_EINSUM_CASES_SMALL if small else _EINSUM_CASES):
        sa, sb, so = eq[0:3], eq[4:7], eq[9:]
        x = torch.randn([sizes[c] for c in sa], generator=g)
        w = torch.randn([sizes[c] for c in sb], generator=g)
        a, sfa = quantize_einsum_operand(x, sa, so, recipe_a, ue8m0)
        b, sfb = quantize_einsum_operand(w, sb, so, recipe_b, ue8m0)
        if ue8m0 and i % 2:
            sfa, sfb = sfa.to(torch.float8_e8m0fnu), sfb.to(torch.float8_e8m0fnu)
        c = (torch.randn([sizes[x] for x in so], generator=g) * 10).to(dtype) if i % 2 == 0 else None
        args = tuple(t.to(device) for t in (a, sfa, b, sfb))
        c = None if c is None else c.to(device).requires_grad_(requires_grad)
        samples.append(SampleInput((eq, *args, c, recipe_a, recipe_b, 1.0 if i else 0.75, dtype), f"{eq} {sizes}"))
    return samples


def fp8_einsum_reference(eq, a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    sa, sb, so = eq[0:3], eq[4:7], eq[9:]

    def deq(x, sf, subs, recipe):
        for dim, letter in enumerate(subs):
            if letter != "h":
                gran = recipe[0] if letter in so else recipe[1]
                sf = sf.float().repeat_interleave(gran, dim=dim).narrow(dim, 0, x.shape[dim])
        return x.double() * sf.double()

    out = alpha * torch.einsum(eq, deq(a, sfa, sa, recipe_a), deq(b, sfb, sb, recipe_b))
    return out if c is None else out + c.double()


def fp8_einsum_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(12)
    eq = "bhr,hdr->bhd"
    a, sfa = quantize_einsum_operand(torch.randn(3, 2, 256, generator=g), "bhr", "bhd", [1, 128], False)
    b, sfb = quantize_einsum_operand(torch.randn(2, 8, 256, generator=g), "hdr", "bhd", [128, 128], False)
    r1, r2 = [1, 128], [128, 128]
    return [
        BadInput(
            ("bmk,bnk->mn", a, sfa, b, sfb, None, r1, r2, 1.0, None),
            r"argument 'equation' value: expected one of 'bhr,hdr->bhd'",
            "equation",
        ),
        BadInput(
            (eq, a.float(), sfa, b, sfb, None, r1, r2, 1.0, None),
            r"argument 'a' dtype: expected torch.float8_e4m3fn",
            "dtype",
        ),
        BadInput(
            (eq, a, sfa, b[:1], sfb[:1], None, r1, r2, 1.0, None), r"argument 'b' size\(0\) \('h'\): expected 2", "h"
        ),
        BadInput(
            (eq, a, sfa, b, sfb, None, r1, [128, 96], 1.0, None),
            r"argument 'b' size\(2\) \('r'\): expected a multiple of gran_k=96",
            "gran_k",
        ),
        BadInput(
            (eq, a, sfa[..., :1], b, sfb, None, r1, r2, 1.0, None),
            r"argument 'sfa' shape: expected \[3, 2, 2\] \(\[bhr\]",
            "sfa shape",
        ),
        BadInput((eq, a, sfa, b, sfb.transpose(1, 2), None, r1, r2, 1.0, None), r"argument 'sfb' shape", "sfb layout"),
        BadInput(
            (eq, a, sfa, b, sfb, torch.zeros(2, 3, 8), r1, r2, 1.0, torch.float32),
            r"argument 'c' shape: expected \[3, 2, 8\]",
            "c",
        ),
    ]


_NO_GRADCHECK = "only c is differentiable (the identity), and outputs are BF16/FP32, with no float64 path"

SPECS = [
    OpSpec(
        "fp8_gemm",
        fp8_gemm_samples,
        fp8_gemm_reference,
        fp8_gemm_bad_inputs,
        portable.fp8_gemm,
        gradcheck=_NO_GRADCHECK,
        device_thresholds=FP8_TENSOR_CORES,
    ),
    OpSpec(
        "fp8_bmm",
        fp8_bmm_samples,
        fp8_bmm_reference,
        fp8_bmm_bad_inputs,
        portable.fp8_bmm,
        gradcheck=_NO_GRADCHECK,
        device_thresholds=FP8_TENSOR_CORES,
    ),
    OpSpec(
        "fp8_einsum",
        fp8_einsum_samples,
        fp8_einsum_reference,
        fp8_einsum_bad_inputs,
        portable.fp8_einsum,
        gradcheck=_NO_GRADCHECK,
        device_thresholds=FP8_TENSOR_CORES,
    ),
]
