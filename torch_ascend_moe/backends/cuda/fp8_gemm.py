"""CUDA kernels of the fp8_gemm family: ``fp8_gemm`` and ``fp8_bmm`` as one launch of the block-scaled Triton
kernel (``_scaled_gemm``: FP8 ``tl.dot`` per K chunk, scales applied to the FP32 partial sums as DeepGEMM does)
instead of the portable kernel's dequantized FP32 copies of both operands. Any recipe whose ``gran_k`` values
share a power-of-two chunk of 32..128 columns (DeepGEMM's 1x128 / 128x128 and the MX 1x32 ones), FP8 or packed
FP4 operands, any strides, FP32 or UE8M0 scales, ``c`` and ``alpha``.

Refused (the chain's next kernel, the portable one, takes them), and why: GPUs before sm89 (no FP8 ``tl.dot``),
recipes whose ``gran_k`` share no such chunk, empty operands, builds without Triton. ``torch._scaled_mm``'s
DeepSeek recipe (1x128 x 128x128, sm90) is not used: it takes K-major FP8 only, FP32 scales only, no ``c``, and its
output rounding and scale-layout rules are not checkable without a GPU; the Triton kernel covers the recipe (the
lent GPU's benchmark compares the two). ``fp8_einsum`` runs the portable composition, whose batched GEMM is
``fp8_bmm``'s chain.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.cuda import triton_available, triton_module
from torch_ascend_moe.checks.fp8_gemm import fp8_bmm_signature, fp8_gemm_signature

_scaled_gemm = triton_module("_scaled_gemm")


def takes_scaled(a, b, recipe_a, recipe_b):
    """The Triton kernel's verdict on validated operands."""
    empty = "empty operands: nothing to launch" if not (a.numel() and b.numel()) else None
    return first_refusal(empty, _scaled_gemm.refusal(a, recipe_a, recipe_b))


def _takes_gemm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    return takes_scaled(a, b, recipe_a, recipe_b)


def _takes_bmm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    fp8_bmm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    return takes_scaled(a, b, recipe_a, recipe_b)


@kernel(device="cuda", library="triton", calls="_scaled_gemm", takes=_takes_gemm, available=triton_available)
def fp8_gemm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    out = torch.empty(shape, dtype=dtype, device=a.device)
    rows = a.new_full((1,), a.shape[0], dtype=torch.int64)
    tiles = _scaled_gemm.segment_tiles(torch.zeros_like(rows), rows, a.shape[0])
    return _scaled_gemm.scaled_gemm(a, sfa, b, sfb, recipe_a, recipe_b, out, tiles, c=c, alpha=alpha)


@kernel(device="cuda", library="triton", calls="_scaled_gemm", takes=_takes_bmm, available=triton_available)
def fp8_bmm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_bmm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    out = torch.empty(shape, dtype=dtype, device=a.device)
    groups, m = a.shape[0], a.shape[1]
    ends = torch.full((groups,), m, dtype=torch.int64, device=a.device)
    tiles = _scaled_gemm.segment_tiles(torch.zeros_like(ends), ends, groups * m)
    return _scaled_gemm.scaled_gemm(a, sfa, b, sfb, recipe_a, recipe_b, out, tiles, c=c, alpha=alpha, a_batched=True)
