"""CUDA kernels of the fp8_linear family: the portable kernels' steps through the dispatcher
(``portable.fp8_quant_gemm_steps`` / ``fp8_linear_steps``), so the GEMM runs ``fp8_gemm``'s CUDA kernel (the
block-scaled Triton kernel of ``_scaled_gemm``, where it takes the call) instead of the portable kernel's
dequantized FP32 copies; the casts are ``quantize_fp8``'s (bitwise the reference casts on every device). BF16
``fp8_linear`` without a bias asks the GEMM for BF16 directly (one rounding, the same bits).

``fp8_quant_gemm`` is one launch where the GEMM's K chunk is the cast's block (``gran_k`` 32, 64 or 128 sharing that
chunk with ``recipe_b``): the per-token cast happens in the tile (``_scaled_gemm``'s ``quantize_a_ue8m0``), bit for
bit the two-launch composition, with no FP8 copy of ``x`` in memory; other recipes run the two steps. ``fp8_linear``
keeps its steps (its weight cast is a second input).
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import cuda_kernel
from torch_ascend_moe.backends.portable import fp8_linear as portable
from torch_ascend_moe.meta.fp8_linear import fp8_quant_gemm_signature

try:
    from torch_ascend_moe.backends.cuda import _scaled_gemm
except ImportError:  # no triton: the steps (each the portable kernel) serve CUDA
    _scaled_gemm = None

# The ops the steps call: the dispatcher (a CUDA tensor reaches each step's CUDA kernel); the tests put the CUDA
# kernels themselves here, as the dispatcher would route CUDA tensors to them, to run the composition on CPU.
OPS = torch.ops.ascend_moe


@cuda_kernel(calls="triton: _scaled_gemm with the cast in the tile | quantize_fp8 -> fp8_gemm")
def fp8_quant_gemm(x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype):
    shape, dtype = fp8_quant_gemm_signature(x, b, sfb, c, gran_k, recipe_b, out_dtype)
    recipe_a = [1, gran_k]
    if casts_in_tile(x, b, recipe_a, recipe_b):
        out = torch.empty(shape, dtype=dtype, device=x.device)
        rows = x.new_full((1,), x.shape[0], dtype=torch.int64)
        tiles = _scaled_gemm.segment_tiles(torch.zeros_like(rows), rows, x.shape[0])
        return _scaled_gemm.scaled_gemm(
            x, None, b, sfb, recipe_a, recipe_b, out, tiles, c=c, alpha=alpha, quantize_a_ue8m0=use_ue8m0
        )
    return portable.fp8_quant_gemm_steps(OPS, x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype)


def casts_in_tile(x, b, recipe_a, recipe_b) -> bool:
    """Whether one launch casts and multiplies (``fp8_quant_gemm``, ``m_grouped_fp8_quant_gemm``): the Triton GEMM
    takes the recipes and its K chunk is the cast's block (one scale per row and chunk)."""
    if _scaled_gemm is None or not (x.numel() and b.numel()) or not _scaled_gemm.usable(x, recipe_a, recipe_b):
        return False
    return _scaled_gemm.block_k(recipe_a, recipe_b) == recipe_a[1]


@cuda_kernel(calls="quantize_fp8 -> fp8_gemm (triton: _scaled_gemm)")
def fp8_linear(x, weight, bias, block, use_ue8m0, fp8_backward):
    return portable.fp8_linear_steps(OPS, x, weight, bias, block, use_ue8m0, fp8_backward)
