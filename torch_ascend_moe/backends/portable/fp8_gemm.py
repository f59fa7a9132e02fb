"""Device-generic ``fp8_gemm``: dequantize both operands with torch ops, multiply in FP32.

Correct on any device (it is the contract's math); accelerator-specific kernels (``torch._scaled_mm``
blockwise on CUDA, ``npu_quant_matmul`` on Ascend) override it per device when they exist.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.meta.fp8_gemm import fp8_gemm_signature, is_fp4
from torch_ascend_moe.quant import decode_e2m1, unpack_e2m1


def dequantize(x: torch.Tensor, sf: torch.Tensor, recipe) -> torch.Tensor:
    """FP32 ``deq(x)[r, k] = x[r, k] * sf[r // gran_mn, k // gran_k]`` (x FP8, or packed FP4 in uint8)."""
    values = decode_e2m1(unpack_e2m1(x)) if is_fp4(x) else x.float()
    gmn, gk = recipe
    scales = sf.float().repeat_interleave(gmn, dim=0)[: values.shape[0]].repeat_interleave(gk, dim=1)
    return values * scales


def fp8_gemm(a, sfa, b, sfb, c=None, recipe_a=(1, 128), recipe_b=(128, 128), alpha=1.0, out_dtype=None):
    shape, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    acc = c.float() if c is not None else torch.zeros(shape, dtype=torch.float32, device=a.device)
    acc = torch.addmm(acc, dequantize(a, sfa, recipe_a), dequantize(b, sfb, recipe_b).t(), alpha=alpha)
    return acc.to(dtype)
