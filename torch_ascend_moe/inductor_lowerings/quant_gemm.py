"""Rewrite: ``quantize_fp8(x, [1, g])`` feeding a scaled GEMM as its A operand becomes the GEMM op that casts ``x``
itself: ``fp8_gemm`` → ``fp8_quant_gemm``, ``m_grouped_fp8_gemm`` (FP8 inference experts) →
``m_grouped_fp8_quant_gemm``. On CPU one C++ kernel with no FP8 copy of ``x`` in memory (the grouped one casts each
expert segment right before its GEMM and never reads rows no expert owns); on CUDA one Triton launch with the cast in
the GEMM's tiles where the K chunk is the cast's block; on Ascend the op's own cast + GEMM steps. Same values: the
fused ops are defined as exactly this cast followed by this GEMM (recipe ``[1, g]``, FP32 or UE8M0 scales, packed or
not: the same numbers; the grouped GEMM reads only the rows its layout owns, whose codes are the same).

Left alone: other cast blocks or a GEMM recipe that differs from the cast's block, a cast whose outputs are used
elsewhere too (the cast would run twice), the requant closing an expert MLP's SwiGLU (``swiglu_epilogue`` fuses it
into the L1 GEMM instead, which saves the FP32 activation's round trip), the masked grouped GEMM (its ``[G, M_max,
K]`` operand is not a cast of this form), and any call the fused op refuses (FP16/FP64 ``x``, K not a multiple of
``g``): its own checks decide, so a rewritten graph never raises where the original ran.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.checks.fp8_linear import fp8_quant_gemm_signature
from torch_ascend_moe.checks.grouped import m_grouped_fp8_quant_signature
from torch_ascend_moe.inductor_lowerings import swiglu_epilogue
from torch_ascend_moe.inductor_lowerings._pass import Plan, accepts, call_args, only_used_by, output_of, rewrite, val

_ops = torch.ops.ascend_moe


def per_token_cast(gemm: torch.fx.Node) -> tuple | None:
    """``(gemm's arguments by name, x, g, use_ue8m0)`` where ``quantize_fp8(x, [1, g])``'s two outputs are ``gemm``'s
    A operand and scales (and feed nothing else) and the GEMM's ``recipe_a`` is the cast's block; else None."""
    args = call_args(gemm)
    cast = output_of(args["a"], _ops.quantize_fp8.default, 0)
    if cast is None or output_of(args["sfa"], _ops.quantize_fp8.default, 1) is not cast:
        return None
    if not only_used_by([args["a"], args["sfa"]], gemm):
        return None
    if swiglu_epilogue.plan_requant(cast) is not None:  # the requant of an expert MLP's SwiGLU: fused there
        return None
    cast_args = call_args(cast)
    block, recipe_a = list(cast_args["block"]), list(args["recipe_a"])
    if block[0] != 1 or recipe_a != block:
        return None
    return args, cast_args["x"], block[1], cast_args["use_ue8m0"]


@rewrite(_ops.fp8_gemm.default, "quant_gemm")
def plan(gemm: torch.fx.Node) -> Plan | None:
    found = per_token_cast(gemm)
    if found is None:
        return None
    args, x, gran_k, ue8m0 = found
    c, recipe_b, alpha = args["c"], list(args["recipe_b"]), args["alpha"]
    out_dtype = val(gemm).dtype  # fp8_quant_gemm's default output dtype is x's, fp8_gemm's is not: say it
    if not accepts(
        fp8_quant_gemm_signature, val(x), val(args["b"]), val(args["sfb"]), val(c), gran_k, recipe_b, out_dtype
    ):
        return None

    def fused(x, b, sfb, *c):
        acc = c[0] if c else None
        return _ops.fp8_quant_gemm.default(x, b, sfb, acc, gran_k, recipe_b, ue8m0, alpha, out_dtype)

    return Plan(fused, [x, args["b"], args["sfb"], *([c] if c is not None else [])], _ops.fp8_quant_gemm.default)


@rewrite(_ops.m_grouped_fp8_gemm.default, "quant_gemm")
def plan_grouped(gemm: torch.fx.Node) -> Plan | None:
    found = per_token_cast(gemm)
    if found is None:
        return None
    args, x, gran_k, ue8m0 = found
    tensors = [x, args["b"], args["sfb"], args["layout"]]
    psum, alignment, recipe_b = args["psum"], args["alignment"], list(args["recipe_b"])
    out_dtype = val(gemm).dtype  # the defaults differ here too (x's dtype vs BF16)
    signature = m_grouped_fp8_quant_signature
    if not accepts(signature, *(val(t) for t in tensors), psum, alignment, gran_k, recipe_b, out_dtype):
        return None

    def fused(x, b, sfb, layout):
        op = _ops.m_grouped_fp8_quant_gemm.default
        return op(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, ue8m0, out_dtype)

    return Plan(fused, tensors, _ops.m_grouped_fp8_quant_gemm.default)


PLANS = {_ops.fp8_gemm.default: plan, _ops.m_grouped_fp8_gemm.default: plan_grouped}  # by the GEMM they take


def takes(gemm: torch.fx.Node) -> bool:
    """Whether this rewrite fuses ``gemm`` with the cast feeding it (``quantize_inline`` then leaves the cast)."""
    return gemm.target in PLANS and PLANS[gemm.target](gemm) is not None
