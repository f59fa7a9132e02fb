"""Benchmark cases of the quant family against the plain-torch reference casts (``quant.reference``: DeepGEMM's
quantizers as torch ops, what the casts were before they became ops) on the same inputs and bits."""

from __future__ import annotations

import torch

from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.quant import dequantize, quantize_fp4, quantize_fp8
from torch_ascend_moe.quant import reference


def _quantize_case(m, n, block, fp4=False, dtype=torch.bfloat16) -> Case:
    op, ref = (quantize_fp4, reference.quantize_fp4) if fp4 else (quantize_fp8, reference.quantize_fp8)

    def setup():
        x = torch.randn(m, n).to(dtype)
        return (lambda: op(x, block, use_ue8m0=True)), (lambda: ref(x, block, True, False))

    name = f"{op.__name__} {list(block)} {str(dtype).removeprefix('torch.')} {m}x{n}"
    return Case(name, m * n, setup, "plain torch")


def _dequantize_case(m, n, block) -> Case:
    def setup():
        data, scale = reference.quantize_fp8(torch.randn(m, n), block, True, False)
        return (lambda: dequantize(data, scale, block, out_dtype=torch.bfloat16)), (
            lambda: reference.dequantize(data, scale, block, torch.bfloat16)
        )

    return Case(f"dequantize {list(block)} -> bfloat16 {m}x{n}", m * n, setup, "plain torch")


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [_quantize_case(64, 512, (1, 128)), _quantize_case(64, 512, (1, 32), fp4=True)]
    return [
        _quantize_case(4096, 7168, (1, 128)),
        _quantize_case(4096, 7168, (128, 1)),
        _quantize_case(2048, 7168, (128, 128)),
        _quantize_case(4096, 7168, (1, 32), fp4=True),
        _dequantize_case(4096, 7168, (1, 128)),
    ]
