"""Benchmark cases of the fp8_gemm family against ``torch.mm``/``bmm``/``einsum`` in FP32 on the same logical shapes.

FP32 is the baseline because it is what the CPU multiplies in: the op dequantizes panels of the
low-precision operands and runs SGEMM on them (issue target: within 1.5x of the FP32 ``torch.mm``).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.fp8_gemm import fp8_bmm, fp8_einsum, fp8_gemm
from torch_ascend_moe.testing.fp8_gemm import _FORMATS, quantize, quantize_einsum_operand


def _case(m, n, k, fmt_index=0) -> Case:
    name, fa, fb = _FORMATS[fmt_index]

    def setup():
        x, w = torch.randn(m, k), torch.randn(n, k)
        a, sfa, ra = quantize(x, fa)
        b, sfb, rb = quantize(w, fb)
        xf, wf = x.clone(), w.clone()
        return (lambda: fp8_gemm(a, sfa, b, sfb, recipe_a=ra, recipe_b=rb)), (lambda: torch.mm(xf, wf.t()))

    return Case(f"fp8_gemm {m}x{n}x{k} {name}", 2 * m * n * k, setup, "torch.mm fp32")


def _bmm_case(groups, m, n, k) -> Case:
    def setup():
        x, w = torch.randn(groups, m, k), torch.randn(groups, n, k)
        a = [quantize(x[i], _FORMATS[0][1]) for i in range(groups)]
        b = [quantize(w[i], _FORMATS[0][2]) for i in range(groups)]
        a, sfa, b, sfb = (torch.stack([p[j] for p in src]) for src, j in ((a, 0), (a, 1), (b, 0), (b, 1)))
        return (lambda: fp8_bmm(a, sfa, b, sfb)), (lambda: torch.bmm(x, w.mT))

    return Case(f"fp8_bmm {groups}x{m}x{n}x{k}", 2 * groups * m * n * k, setup, "torch.bmm fp32")


def _einsum_case(b_, h, r, d) -> Case:
    eq = "bhr,hdr->bhd"

    def setup():
        x, w = torch.randn(b_, h, r), torch.randn(h, d, r)
        a, sfa = quantize_einsum_operand(x, "bhr", "bhd", (1, 128), False)
        b, sfb = quantize_einsum_operand(w, "hdr", "bhd", (128, 128), False)
        return (lambda: fp8_einsum(eq, a, sfa, b, sfb)), (lambda: torch.einsum(eq, x, w))

    return Case(f"fp8_einsum {eq} b{b_} h{h} r{r} d{d}", 2 * b_ * h * r * d, setup, "torch.einsum fp32")


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [_case(1, 256, 512), _case(64, 256, 512, 2), _bmm_case(2, 16, 128, 256), _einsum_case(8, 2, 256, 128)]
    return [
        _case(1, 2112, 7168),
        _case(16, 2112, 7168),
        _case(128, 2112, 1792),
        _case(512, 2048, 2048),
        _case(128, 2112, 1792, 1),
        _case(128, 2112, 1792, 2),
        _case(128, 2112, 1792, 3),
        _bmm_case(8, 64, 512, 1024),
        _einsum_case(64, 8, 1024, 512),
    ]
