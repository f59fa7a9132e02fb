"""Device-generic ``fp8_gemm``: dequantize both operands with torch ops (``quant.reference.dequantized``), multiply
in FP32.

Correct on any device (it is the contract's math); accelerator-specific kernels (``torch._scaled_mm``
blockwise on CUDA, ``npu_quant_matmul`` on Ascend) override it per device when they exist.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks.fp8_gemm import einsum_plan, fp8_bmm_signature, fp8_einsum_signature, fp8_gemm_signature
from torch_ascend_moe.quant.reference import dequantized


@portable_kernel
def fp8_gemm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    acc = c.float() if c is not None else torch.zeros(shape, dtype=torch.float32, device=a.device)
    acc = torch.addmm(acc, dequantized(a, sfa, recipe_a), dequantized(b, sfb, recipe_b).t(), alpha=alpha)
    return acc.to(dtype)


@portable_kernel
def fp8_bmm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_bmm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    acc = c.float() if c is not None else torch.zeros(shape, dtype=torch.float32, device=a.device)
    a_deq, b_deq = dequantized(a, sfa, recipe_a), dequantized(b, sfb, recipe_b)
    return torch.baddbmm(acc, a_deq, b_deq.transpose(1, 2), alpha=alpha).to(dtype)


@portable_kernel
def fp8_einsum(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_einsum_signature(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    _, _, _, perm_a, perm_b, perm_out = einsum_plan(equation)
    c_h = None if c is None else c.permute(perm_out).float()
    d_h = fp8_bmm(
        a.permute(perm_a),
        sfa.permute(perm_a),
        b.permute(perm_b),
        sfb.permute(perm_b),
        c_h,
        recipe_a,
        recipe_b,
        alpha,
        torch.float32,
    )
    out = torch.empty(shape, dtype=dtype, device=a.device)
    out.permute(perm_out).copy_(d_h)
    return out
