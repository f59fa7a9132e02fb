"""The fp8_linear family on Ascend: no kernel of its own; the portable kernels are their steps through the
dispatcher, so each step reaches its own Ascend chain where an adapter maps (``quantize_fp8``:
``npu_dynamic_mx_quant`` for 1 x c UE8M0 rows on Ascend 950; ``fp8_gemm``: ``npu_quant_matmul``'s G-B mode for
the 1x128 x 128x128 FP32-scale recipe to BF16 on Ascend 950) and the portable kernel elsewhere. Bitwise the
portable kernels: the quantizers are DeepGEMM's casts on every path, and the GEMM keeps one FP32 accumulation
rounded once.

* ``fp8_quant_gemm``: ``quantize_fp8(x, [1, gran_k])`` then ``fp8_gemm``; DeepSeek-V3's recipe (``gran_k=128``,
  ``recipe_b=[128, 128]``, no ``c``, ``alpha=1``, BF16 out) is one ``npu_quant_matmul`` after the cast.
* ``fp8_linear`` forward: ``x`` cast 1 x block, ``weight`` block x block, then ``fp8_gemm``. For BF16 ``x``
  without a bias the GEMM is asked for BF16 directly (the FP32 sum rounded once, the same bits as FP32 then
  ``.to(bf16)``), which is the G-B mode for ``block=128``; with a bias the FP32 output is kept (the bias is added
  before the one rounding; ``npu_quant_matmul``'s bias is not documented as added in FP32), so that call stays on
  the portable GEMM. Its backward GEMMs (``autograd/fp8_linear.py``) already call ``fp8_gemm`` through the
  dispatcher: dgrad (1 x block x block x block) maps the same way; wgrad (1 x block on both operands) has no G-B
  form.

GE graph mode (TorchAir): ``fp8_quant_gemm``'s converter is the two converters in sequence (``quantize_fp8``'s
``DynamicMxQuant``, ``fp8_gemm``'s ``QuantBatchMatmulV4``): UE8M0 1 x 128 casts with the 128 x 128 weight recipe
on Ascend 950; anything else has no graph. ``fp8_linear`` has no converter: its block x block weight cast has no
CANN op (and GE no fallback).
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import npu_ge_converter
from torch_ascend_moe.backends.chain import stays_portable
from torch_ascend_moe.backends.npu import fp8_gemm as npu_fp8_gemm
from torch_ascend_moe.backends.npu import ge_graph
from torch_ascend_moe.backends.npu import quant as npu_quant


@npu_ge_converter("fp8_quant_gemm", ir="DynamicMxQuant + QuantBatchMatmulV4")
def fp8_quant_gemm_ge(x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype, meta_outputs=None):
    # The cast's outputs as our op's fake computes them: the GEMM converter decides from their metas.
    q_meta, sf_meta = torch.ops.ascend_moe.quantize_fp8(x.meta, [1, gran_k], use_ue8m0, False)
    q, sf = npu_quant.quantize_fp8_ge(x, [1, gran_k], use_ue8m0, False)
    q, sf = ge_graph.with_meta(q, q_meta), ge_graph.with_meta(sf, sf_meta)
    return npu_fp8_gemm.fp8_gemm_ge(q, sf, b, sfb, c, [1, gran_k], recipe_b, alpha, out_dtype, meta_outputs)


stays_portable(
    "fp8_linear",
    "fp8_quant_gemm",
    device="npu",
    why="no kernel of its own: its portable steps (the casts, fp8_gemm) reach their own Ascend chains",
)
