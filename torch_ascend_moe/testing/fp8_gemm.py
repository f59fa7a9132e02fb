"""Sample inputs, bad inputs and the harness spec of ``fp8_gemm``.

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
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

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


def fp8_gemm_reference(a, sfa, b, sfb, c=None, recipe_a=(1, 128), recipe_b=(128, 128), alpha=1.0, out_dtype=None):
    """fp64 product of the exactly dequantized operands."""
    a64 = portable.dequantize(a, sfa, recipe_a).double()
    b64 = portable.dequantize(b, sfb, recipe_b).double()
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


SPECS = [
    OpSpec(
        "fp8_gemm",
        fp8_gemm_samples,
        fp8_gemm_reference,
        fp8_gemm_bad_inputs,
        portable.fp8_gemm,
        gradcheck=False,  # only c is differentiable, and outputs are BF16/FP32 (no FP64 path to check)
    )
]
