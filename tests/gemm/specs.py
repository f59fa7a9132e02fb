"""Sample inputs, fp64 references, bad inputs and harness specs of the gemm family."""

from __future__ import annotations

import itertools

import torch

from torch_ascend_moe.backends.portable import gemm as portable
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput


def make_operand(shape, dtype, device, *, mn_major=False, requires_grad=False, generator=None, scale=1.0):
    """A random leaf tensor of logical ``shape``; ``mn_major`` stores it with the last two dims swapped."""
    storage = list(shape)
    if mn_major:
        storage[-2], storage[-1] = storage[-1], storage[-2]
    t = torch.randn(storage, generator=generator, dtype=torch.float64) * scale
    t = t.to(dtype=dtype, device=device)
    if mn_major:
        t = t.transpose(-2, -1)
    return t.detach().requires_grad_(requires_grad)


def _f64(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.to(torch.float64)


def gemm_reference(a, b, c, alpha, out_dtype) -> torch.Tensor:
    out = alpha * (_f64(a) @ _f64(b).T)
    return out if c is None else out + _f64(c)


def bmm_reference(a, b, c, alpha, out_dtype) -> torch.Tensor:
    out = alpha * (_f64(a) @ _f64(b).transpose(1, 2))
    return out if c is None else out + _f64(c)


def einsum_reference(equation, a, b, c, alpha, out_dtype) -> torch.Tensor:
    out = alpha * torch.einsum(equation, _f64(a), _f64(b))
    return out if c is None else out + _f64(c)


def _variants(dtype):
    """(a MN-major, b MN-major, with c, alpha, out_dtype) combinations, cycled over the shapes."""
    out_dtypes = [None, torch.float32] if dtype in (torch.bfloat16, torch.float16) else [None]
    return itertools.cycle(
        [
            (False, False, False, 1.0, out_dtypes[0]),
            (True, False, True, 0.5, out_dtypes[-1]),
            (False, True, True, -1.25, out_dtypes[0]),
            (True, True, False, 2.0, out_dtypes[-1]),
        ]
    )


_GEMM_SHAPES = [(1, 576, 448), (128, 528, 448), (129, 1010, 256), (64, 96, 1024), (0, 64, 32), (16, 8, 0)]
_GEMM_SHAPES_SMALL = [(1, 8, 16), (5, 7, 24), (6, 12, 8), (0, 4, 8), (3, 5, 0)]


def gemm_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(2)
    samples = []
    for (m, n, k), (a_t, b_t, with_c, alpha, out_dtype) in zip(
        _GEMM_SHAPES_SMALL if small else _GEMM_SHAPES, _variants(dtype)
    ):
        a = make_operand((m, k), dtype, device, mn_major=a_t, requires_grad=requires_grad, generator=g)
        b = make_operand((n, k), dtype, device, mn_major=b_t, requires_grad=requires_grad, generator=g)
        c_dtype = out_dtype or dtype
        c = (
            make_operand((m, n), c_dtype, device, requires_grad=requires_grad, generator=g, scale=32)
            if with_c
            else None
        )
        name = f"M{m}N{n}K{k}{'-aT' if a_t else ''}{'-bT' if b_t else ''}{'-c' if with_c else ''}-{out_dtype}"
        samples.append(SampleInput((a, b, c, alpha, out_dtype), name))
    return samples


_BMM_SHAPES = [(4, 1, 576, 448), (3, 128, 96, 256), (2, 33, 65, 130), (0, 4, 4, 8), (2, 0, 8, 16), (2, 4, 8, 0)]
_BMM_SHAPES_SMALL = [(2, 1, 8, 16), (3, 5, 7, 12), (1, 4, 6, 8), (2, 0, 3, 4), (2, 3, 4, 0)]


def bmm_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(3)
    samples = []
    for (bs, m, n, k), (a_t, b_t, with_c, alpha, out_dtype) in zip(
        _BMM_SHAPES_SMALL if small else _BMM_SHAPES, _variants(dtype)
    ):
        a = make_operand((bs, m, k), dtype, device, mn_major=a_t, requires_grad=requires_grad, generator=g)
        b = make_operand((bs, n, k), dtype, device, mn_major=b_t, requires_grad=requires_grad, generator=g)
        c_dtype = out_dtype or dtype
        c = (
            make_operand((bs, m, n), c_dtype, device, requires_grad=requires_grad, generator=g, scale=32)
            if with_c
            else None
        )
        name = f"B{bs}M{m}N{n}K{k}{'-aT' if a_t else ''}{'-bT' if b_t else ''}{'-c' if with_c else ''}-{out_dtype}"
        samples.append(SampleInput((a, b, c, alpha, out_dtype), name))
    return samples


# (equation, sizes of every subscript): scaled-down DeepGEMM einsum shapes, plus odd sizes.
_EINSUM_CASES = [
    ("bmk,bnk->mn", dict(b=5, m=128, n=384, k=128)),
    ("bmk,bnk->mn", dict(b=3, m=33, n=17, k=40)),
    ("bhr,hdr->bhd", dict(b=32, h=8, r=512, d=128)),
    ("bhr,hdr->bhd", dict(b=3, h=5, r=24, d=7)),
    ("bhd,hdr->bhr", dict(b=32, h=8, d=128, r=512)),
    ("bhd,hdr->bhr", dict(b=1, h=3, d=9, r=20)),
    ("bhd,bhr->hdr", dict(b=64, h=4, d=128, r=96)),
    ("bhd,bhr->hdr", dict(b=0, h=2, d=8, r=4)),
]
_EINSUM_CASES_SMALL = [
    ("bmk,bnk->mn", dict(b=3, m=4, n=5, k=6)),
    ("bhr,hdr->bhd", dict(b=3, h=2, r=5, d=4)),
    ("bhd,hdr->bhr", dict(b=2, h=3, d=4, r=6)),
    ("bhd,bhr->hdr", dict(b=5, h=2, d=3, r=4)),
]


def einsum_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(4)
    samples = []
    for (equation, sizes), (_, _, with_c, alpha, out_dtype) in zip(
        _EINSUM_CASES_SMALL if small else _EINSUM_CASES, _variants(dtype)
    ):
        sa, sb, so = equation[0:3], equation[4:7], equation[9:]
        a = make_operand([sizes[x] for x in sa], dtype, device, requires_grad=requires_grad, generator=g)
        b = make_operand([sizes[x] for x in sb], dtype, device, requires_grad=requires_grad, generator=g)
        c_dtype = out_dtype or dtype
        c = None
        if with_c:
            c = make_operand([sizes[x] for x in so], c_dtype, device, requires_grad=requires_grad, generator=g)
        name = f"{equation}-{'-'.join(f'{k}{v}' for k, v in sizes.items())}{'-c' if with_c else ''}-{out_dtype}"
        samples.append(SampleInput((equation, a, b, c, alpha, out_dtype), name))
    return samples


def _bf16(*shape, device="cpu", dtype=torch.bfloat16):
    return torch.randn(*shape).to(dtype=dtype, device=device)


def gemm_bad_inputs(device) -> list[BadInput]:
    a, b = _bf16(4, 16, device=device), _bf16(8, 16, device=device)
    return [
        BadInput(
            (a.to(torch.int32), b, None, 1.0, None), r"argument 'a' dtype: expected one of torch\.bfloat16", "int a"
        ),
        BadInput((a, b.float(), None, 1.0, None), r"argument 'b' dtype: expected torch\.bfloat16", "mixed dtypes"),
        BadInput((a, _bf16(8, 12, device=device), None, 1.0, None), r"argument 'b' size\(1\) \(K\): expected 16", "K"),
        BadInput((_bf16(2, 4, 16, device=device), b, None, 1.0, None), r"argument 'a' rank: expected 2-D", "rank"),
        BadInput((a, b, _bf16(4, 8, device=device).float(), 1.0, torch.bfloat16), r"argument 'c' dtype", "c dtype"),
        BadInput((a, b, _bf16(4, 9, device=device), 1.0, None), r"argument 'c' shape: expected \[4, 8\]", "c shape"),
        BadInput((a, b, None, 1.0, torch.int8), r"argument 'out_dtype' value", "out_dtype"),
        BadInput(
            (a, b.to("meta"), None, 1.0, None),
            r"argument 'b' device: expected (cpu|cuda:0) \(same as 'a'\), got meta",
            "device",
        ),
    ]


def bmm_bad_inputs(device) -> list[BadInput]:
    a, b = _bf16(2, 4, 16, device=device), _bf16(2, 8, 16, device=device)
    return [
        BadInput((a.half(), b, None, 1.0, None), r"argument 'b' dtype: expected torch\.float16", "mixed dtypes"),
        BadInput((a, _bf16(3, 8, 16, device=device), None, 1.0, None), r"argument 'b' size\(0\) \(batch\)", "batch"),
        BadInput((a, _bf16(2, 8, 15, device=device), None, 1.0, None), r"argument 'b' size\(2\) \(K\)", "K"),
        BadInput((a[0], b, None, 1.0, None), r"argument 'a' rank: expected 3-D", "rank"),
        BadInput((a, b, _bf16(2, 8, 4, device=device), 1.0, None), r"argument 'c' shape", "c shape"),
        BadInput((a, b.to("meta"), None, 1.0, None), r"argument 'b' device", "device"),
    ]


def einsum_bad_inputs(device) -> list[BadInput]:
    a, w = _bf16(3, 2, 16, device=device), _bf16(2, 8, 16, device=device)
    return [
        BadInput(("bhr,hrd->bhd", a, w, None, 1.0, None), r"argument 'equation' value: expected one of", "equation"),
        BadInput(("bhr,hdr->bhd", a, _bf16(4, 8, 16, device=device), None, 1.0, None), r"size\(0\) \('h'\)", "h"),
        BadInput(("bhr,hdr->bhd", a, _bf16(2, 8, 12, device=device), None, 1.0, None), r"size\(2\) \('r'\)", "r"),
        BadInput(("bhr,hdr->bhd", a[0], w, None, 1.0, None), r"argument 'a' rank: expected 3-D \[bhr\]", "rank"),
        BadInput(("bhr,hdr->bhd", a.int(), w, None, 1.0, None), r"argument 'a' dtype", "dtype"),
        BadInput(("bhr,hdr->bhd", a, w, _bf16(3, 2, 9, device=device), 1.0, None), r"argument 'c' shape", "c"),
    ]


SPECS = [
    OpSpec(
        "bf16_gemm",
        gemm_samples,
        gemm_reference,
        gemm_bad_inputs,
        portable.bf16_gemm,
    ),
    OpSpec(
        "bf16_bmm",
        bmm_samples,
        bmm_reference,
        bmm_bad_inputs,
        portable.bf16_bmm,
    ),
    OpSpec(
        "bf16_einsum",
        einsum_samples,
        einsum_reference,
        einsum_bad_inputs,
        portable.bf16_einsum,
    ),
]
