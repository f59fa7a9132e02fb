"""Rewrite: a ``quantize_fp8`` call becomes its own math in ATen ops (``quant.reference.quantize_fp8``, the
portable kernel, which the C++ kernel matches bit for bit), so Inductor fuses the per-block amax, scale and E4M3
cast into the kernels around it: an RMSNorm (or any pointwise/reduction producer) and the cast become one pass over
the activations, instead of the producer writing them out and our opaque kernel reading them back.

Same values as the op on the same input, bit for bit (NaN/inf blocks and UE8M0 scales included): the reference is
the op's definition. Where the producer is fused in, the cast reads the producer's value before the
rounding to its output dtype that the unfused graph stores (Inductor keeps fused intermediates in FP32, as it
does for its own pointwise chains): one rounding instead of two, within the cast's own error.

Only where Inductor generates the kernels (``DEVICES``: CPU and CUDA; on Ascend the op's adapter is CANN's
``npu_dynamic_mx_quant``). Left alone: a cast feeding ``fp8_gemm`` or ``m_grouped_fp8_gemm`` where ``quant_gemm``
fuses the pair (into ``fp8_quant_gemm`` / ``m_grouped_fp8_quant_gemm``), the requant closing an expert MLP's SwiGLU
(``swiglu_epilogue`` fuses it into the grouped GEMM), shapes that are not whole blocks (see ``plan``), packed UE8M0
scales (the packing checks scale values: a data-dependent step Inductor cannot trace), calls the op refuses (its own
checks decide, so a rewritten graph never runs where the original raised).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.checks.quant import QUANTIZE_FP8, quantize_signature
from torch_ascend_moe.inductor_lowerings import quant_gemm, swiglu_epilogue
from torch_ascend_moe.inductor_lowerings._pass import Plan, accepts, call_args, rewrite, val
from torch_ascend_moe.quant import reference

DEVICES = {"cpu", "cuda"}  # where Inductor writes the fused kernels
_ops = torch.ops.ascend_moe


@rewrite(_ops.quantize_fp8.default, "quantize_inline")
def plan(cast: torch.fx.Node) -> Plan | None:
    args = call_args(cast)
    x, block, ue8m0, packed = args["x"], list(args["block"]), args["use_ue8m0"], args["use_packed_ue8m0"]
    fx = val(x)
    if fx is None or fx.device.type not in DEVICES or packed:
        return None
    if any(quant_gemm.takes(user) for out in cast.users for user in out.users):
        return None
    if swiglu_epilogue.plan_requant(cast) is not None:  # the requant of an expert MLP's SwiGLU: fused there
        return None
    if not accepts(quantize_signature, QUANTIZE_FP8, fx, block, ue8m0, packed, False):
        return None
    # Whole blocks only: torch 2.13's Inductor (CPU) miscompiles pad -> view -> amax -> multiply -> slice, the
    # reference's ragged last block (its values come out 0; tests/inductor_lowerings/test_quantize_inline.py keeps
    # a reproducer that says when a torch fixes it).
    m, n = fx.shape
    if isinstance(m, int) and isinstance(n, int):
        rows, cols = reference._cut(block, m, n)
        whole = m % rows == 0 and n % cols == 0
    else:  # a dynamic token count: the per-token cast of a static hidden size
        whole = block[0] == 1 and isinstance(n, int) and n % min(block[1], max(n, 1)) == 0
    if not whole:
        return None

    def inline(x):
        return reference.quantize_fp8(x, block, ue8m0, packed)

    return Plan(inline, [x], _ops.quantize_fp8.default)
