"""CUDA kernel of the fp8_linear family: ``fp8_quant_gemm`` as one launch where the GEMM's K chunk is the cast's
block (``gran_k`` 32, 64 or 128 sharing that chunk with ``recipe_b``): the per-token cast happens in the tile
(``_scaled_gemm``'s ``quantize_a_ue8m0``), bit for bit the two-launch composition, with no FP8 copy of ``x`` in
memory. Other recipes are refused: the portable kernel runs the cast and ``fp8_gemm`` through the dispatcher, each
reaching its own CUDA chain. ``fp8_linear`` has no kernel here for the same reason (its weight cast is a second
input).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.cuda import triton_available, triton_module
from torch_ascend_moe.checks.fp8_linear import fp8_quant_gemm_signature

_scaled_gemm = triton_module("_scaled_gemm")


def cast_in_tile_refusal(x, b, recipe_a, recipe_b) -> str | None:
    """Why one launch cannot cast and multiply (``fp8_quant_gemm``, ``m_grouped_fp8_quant_gemm``), or None: the
    Triton GEMM takes the recipes and its K chunk is the cast's block (one scale per row and chunk)."""
    if not (x.numel() and b.numel()):
        return "empty operands: nothing to launch"
    why = _scaled_gemm.refusal(x, recipe_a, recipe_b)
    if why is None and _scaled_gemm.block_k(recipe_a, recipe_b) != recipe_a[1]:
        why = f"the GEMM's K chunk is not the cast's block of {recipe_a[1]} (recipe_b {list(recipe_b)})"
    return why


def _takes(x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype):
    fp8_quant_gemm_signature(x, b, sfb, c, gran_k, recipe_b, out_dtype)
    return first_refusal(cast_in_tile_refusal(x, b, [1, gran_k], recipe_b))


@kernel(
    device="cuda",
    library="triton",
    calls="_scaled_gemm with the cast in the tile",
    takes=_takes,
    available=triton_available,
)
def fp8_quant_gemm(x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype):
    shape, dtype = fp8_quant_gemm_signature(x, b, sfb, c, gran_k, recipe_b, out_dtype)
    out = torch.empty(shape, dtype=dtype, device=x.device)
    rows = x.new_full((1,), x.shape[0], dtype=torch.int64)
    tiles = _scaled_gemm.segment_tiles(torch.zeros_like(rows), rows, x.shape[0])
    return _scaled_gemm.scaled_gemm(
        x, None, b, sfb, [1, gran_k], recipe_b, out, tiles, c=c, alpha=alpha, quantize_a_ue8m0=use_ue8m0
    )
