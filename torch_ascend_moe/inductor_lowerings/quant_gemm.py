"""Rewrite: ``quantize_fp8(x, [1, g])`` feeding ``fp8_gemm`` as its A operand becomes one ``fp8_quant_gemm`` (the
per-token cast inside the GEMM op: on CPU one C++ kernel with no FP8 copy of ``x`` in memory; on CUDA and Ascend
the op's own cast + GEMM steps). Same values: ``fp8_quant_gemm`` is defined as exactly this cast followed by this
GEMM (recipe ``[1, g]``, FP32 or UE8M0 scales, packed or not: the same numbers).

Left alone: other cast blocks or a GEMM recipe that differs from the cast's block, a cast whose outputs are used
elsewhere too (the cast would run twice), and any call ``fp8_quant_gemm`` refuses (FP16/FP64 ``x``, K not a multiple
of ``g``): its own checks decide, so a rewritten graph never raises where the original ran.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.inductor_lowerings._pass import Plan, accepts, call_args, only_used_by, output_of, rewrite, val
from torch_ascend_moe.meta.fp8_linear import fp8_quant_gemm_signature

_ops = torch.ops.ascend_moe


@rewrite(_ops.fp8_gemm.default, "quant_gemm")
def plan(gemm: torch.fx.Node) -> Plan | None:
    args = call_args(gemm)
    cast = output_of(args["a"], _ops.quantize_fp8.default, 0)
    if cast is None or output_of(args["sfa"], _ops.quantize_fp8.default, 1) is not cast:
        return None
    if not only_used_by([args["a"], args["sfa"]], gemm):
        return None
    cast_args = call_args(cast)
    block, recipe_a = list(cast_args["block"]), list(args["recipe_a"])
    if block[0] != 1 or recipe_a != block:
        return None
    x, c, gran_k, ue8m0 = cast_args["x"], args["c"], block[1], cast_args["use_ue8m0"]
    recipe_b, alpha = list(args["recipe_b"]), args["alpha"]
    out_dtype = val(gemm).dtype  # fp8_quant_gemm's default output dtype is x's, fp8_gemm's is not: say it
    if not accepts(
        fp8_quant_gemm_signature, val(x), val(args["b"]), val(args["sfb"]), val(c), gran_k, recipe_b, out_dtype
    ):
        return None

    def fused(x, b, sfb, *c):
        acc = c[0] if c else None
        return _ops.fp8_quant_gemm.default(x, b, sfb, acc, gran_k, recipe_b, ue8m0, alpha, out_dtype)

    return Plan(fused, [x, args["b"], args["sfb"], *([c] if c is not None else [])], _ops.fp8_quant_gemm.default)
