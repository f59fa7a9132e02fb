"""Sample inputs, bad inputs and the harness specs of the fp8_linear family (fp8_quant_gemm, fp8_linear).

``dtype`` is the high-precision input dtype (and the output's). References cast with the reference
quantizer (``quant.block_cast_to_fp8``, the same bits as the ops') and multiply in fp64, so the numerics
check measures the GEMM; the quantization error itself is measured in tests/fp8_linear.
"""

from __future__ import annotations

import torch

from tests.fp8_gemm.specs import quantize
from torch_ascend_moe import quant
from torch_ascend_moe.backends.portable import fp8_linear as portable
from torch_ascend_moe.quant.reference import dequantized
from torch_ascend_moe.testing.harness import FP8_TENSOR_CORES, BadInput, OpSpec, SampleInput

# (M, N, K, gran_k, weight format (see tests.fp8_gemm.specs.quantize), use_ue8m0, with c, alpha)
_QUANT_GEMM_CASES = [
    (1, 576, 512, 128, ("fp8-block", 128, 128, False), False, False, 1.0),
    (33, 129, 384, 128, ("fp8-block", 128, 128, True), True, True, 0.5),
    (9, 40, 256, 32, ("fp4", 1, 32, True), True, False, 1.0),
    (0, 16, 128, 128, ("fp8-token", 1, 128, False), False, True, 1.0),
]
_QUANT_GEMM_CASES_SMALL = [
    (1, 8, 128, 128, ("fp8-block", 128, 128, False), False, False, 1.0),
    (5, 7, 256, 128, ("fp8-token", 1, 128, True), True, True, -2.0),
    (3, 6, 64, 32, ("fp4", 1, 32, True), True, False, 1.0),
]


def fp8_quant_gemm_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(13)
    samples = []
    for m, n, k, gran_k, fmt, ue8m0, with_c, alpha in _QUANT_GEMM_CASES_SMALL if small else _QUANT_GEMM_CASES:
        x = torch.randn(m, k, generator=g).to(dtype)
        b, sfb, recipe_b = quantize(torch.randn(n, k, generator=g), fmt)
        c = (torch.randn(m, n, generator=g) * 4).to(dtype) if with_c else None
        x, b, sfb = x.to(device).requires_grad_(requires_grad), b.to(device), sfb.to(device)
        c = None if c is None else c.to(device).requires_grad_(requires_grad)
        name = f"M{m}N{n}K{k} gran_k={gran_k} {fmt[0]}{' ue8m0' if ue8m0 else ''}{' +c' if with_c else ''}"
        samples.append(SampleInput((x, b, sfb, c, gran_k, recipe_b, ue8m0, alpha, None), name))
    return samples


def fp8_quant_gemm_reference(x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype):
    q, sf = quant.block_cast_to_fp8(x.detach(), (1, gran_k), use_ue8m0)
    out = alpha * (dequantized(q, sf, (1, gran_k)).double() @ dequantized(b, sfb, recipe_b).double().T)
    return out if c is None else out + c.double()


def fp8_quant_gemm_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(14)
    x = torch.randn(4, 256, generator=g, dtype=torch.bfloat16)
    b, sfb, rb = quantize(torch.randn(8, 256, generator=g), ("fp8-block", 128, 128, False))
    return [
        BadInput(
            (x.half(), b, sfb, None, 128, rb, False, 1.0, None), r"argument 'x' dtype: expected torch.bfloat16", "x"
        ),
        BadInput(
            (x, b, sfb, None, 96, rb, False, 1.0, None),
            r"argument 'x' size\(1\) \(K\): expected a multiple of gran_k=96",
            "K",
        ),
        BadInput(
            (x, b, sfb, None, 0, rb, False, 1.0, None),
            r"argument 'gran_k' value: expected a positive integer",
            "gran_k",
        ),
        BadInput(
            (x, b, sfb[:, :1], None, 128, rb, False, 1.0, None), r"argument 'sfb' shape: expected \[1, 2\]", "sfb"
        ),
        BadInput(
            (x[:, :128], b, sfb, None, 128, rb, False, 1.0, None), r"argument 'b' K: expected 128 \(x's K\)", "b K"
        ),
        BadInput((x, b, sfb, None, 128, rb, False, 1.0, torch.float16), r"argument 'out_dtype' value", "out_dtype"),
    ]


# (M, N, K, block, use_ue8m0, bias)
_LINEAR_CASES = [(64, 96, 256, 128, False, True), (1, 130, 128, 128, True, False), (37, 48, 96, 32, True, True)]
_LINEAR_CASES_SMALL = [(4, 6, 128, 128, False, True), (3, 5, 64, 32, True, False), (0, 4, 128, 128, False, True)]


def fp8_linear_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(15)
    samples = []
    for i, (m, n, k, block, ue8m0, with_bias) in enumerate(_LINEAR_CASES_SMALL if small else _LINEAR_CASES):
        x, w = torch.randn(m, k, generator=g).to(dtype), (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
        bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
        x, w = (t.to(device).requires_grad_(requires_grad) for t in (x, w))
        bias = None if bias is None else bias.to(device).requires_grad_(requires_grad)
        name = f"M{m}N{n}K{k} block={block}{' ue8m0' if ue8m0 else ''}{' +bias' if with_bias else ''}"
        samples.append(SampleInput((x, w, bias, block, ue8m0, i % 2 == 0), name))
    return samples


def fp8_linear_reference(x, weight, bias, block, use_ue8m0, fp8_backward):
    xq, xs = quant.block_cast_to_fp8(x.detach(), (1, block), use_ue8m0)
    wq, ws = quant.block_cast_to_fp8(weight.detach(), (block, block), use_ue8m0)
    out = dequantized(xq, xs, (1, block)).double() @ dequantized(wq, ws, (block, block)).double().T
    return out if bias is None else out + bias.detach().double()


def fp8_linear_bad_inputs(device) -> list[BadInput]:
    g = torch.Generator().manual_seed(16)
    x, w, bias = torch.randn(4, 256, generator=g), torch.randn(8, 256, generator=g), torch.randn(8, generator=g)
    return [
        BadInput(
            (x.double(), w, bias, 128, False, True),
            r"argument 'x' dtype: expected torch.bfloat16 or torch.float32",
            "x",
        ),
        BadInput(
            (x, w.bfloat16(), bias, 128, False, True),
            r"argument 'weight' dtype: expected torch.float32 \(same as 'x'\)",
            "w dtype",
        ),
        BadInput((x, w[:, :128], bias, 128, False, True), r"argument 'weight' size\(1\) \(K\): expected 256", "K"),
        BadInput(
            (x, w, bias, 96, False, True), r"argument 'x' size\(1\) \(K\): expected a multiple of block=96", "block"
        ),
        BadInput((x, w, bias[:3], 128, False, True), r"argument 'bias' shape: expected \[8\]", "bias"),
        BadInput((x, w.unsqueeze(0), bias, 128, False, True), r"argument 'weight' rank: expected 2-D", "rank"),
    ]


SPECS = [
    OpSpec(
        "fp8_quant_gemm",
        fp8_quant_gemm_samples,
        fp8_quant_gemm_reference,
        fp8_quant_gemm_bad_inputs,
        portable.fp8_quant_gemm,
        gradcheck="x is cast to FP8 (piecewise constant); its straight-through gradient is tested in tests/fp8_linear",
        device_thresholds=FP8_TENSOR_CORES,
    ),
    OpSpec(
        "fp8_linear",
        fp8_linear_samples,
        fp8_linear_reference,
        fp8_linear_bad_inputs,
        portable.fp8_linear,
        gradcheck="the FP8 casts are piecewise constant; the straight-through gradients are tested in tests/fp8_linear",
        device_thresholds=FP8_TENSOR_CORES,
    ),
]
