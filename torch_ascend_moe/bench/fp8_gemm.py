"""Benchmark cases of ``fp8_gemm`` against ``torch.mm`` in FP32 on the same logical shape.

FP32 is the baseline because it is what the CPU multiplies in: the op dequantizes panels of the
low-precision operands and runs SGEMM on them (issue target: within 1.5x of the FP32 ``torch.mm``).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.fp8_gemm import fp8_gemm
from torch_ascend_moe.testing.fp8_gemm import _FORMATS, quantize


def _case(m, n, k, fmt_index=0) -> Case:
    name, fa, fb = _FORMATS[fmt_index]

    def setup():
        x, w = torch.randn(m, k), torch.randn(n, k)
        a, sfa, ra = quantize(x, fa)
        b, sfb, rb = quantize(w, fb)
        xf, wf = x.clone(), w.clone()
        return (lambda: fp8_gemm(a, sfa, b, sfb, recipe_a=ra, recipe_b=rb)), (lambda: torch.mm(xf, wf.t()))

    return Case(f"fp8_gemm {m}x{n}x{k} {name}", 2 * m * n * k, setup, "torch.mm fp32")


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [_case(1, 256, 512), _case(64, 256, 512, 2)]
    return [
        _case(1, 2112, 7168),
        _case(16, 2112, 7168),
        _case(128, 2112, 1792),
        _case(512, 2048, 2048),
        _case(128, 2112, 1792, 1),
        _case(128, 2112, 1792, 2),
        _case(128, 2112, 1792, 3),
    ]
