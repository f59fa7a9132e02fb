"""Typed Python entry points to the ascend_moe ops, one module per family."""

from torch_ascend_moe.ops.fp8_gemm import fp8_bmm, fp8_einsum, fp8_gemm
from torch_ascend_moe.ops.fp8_linear import fp8_linear, fp8_quant_gemm
from torch_ascend_moe.ops.gemm import bf16_bmm, bf16_einsum, bf16_gemm
from torch_ascend_moe.ops.grouped import (
    k_grouped_bf16_gemm,
    k_grouped_fp8_gemm,
    m_grouped_bf16_gemm,
    m_grouped_bf16_gemm_masked,
    m_grouped_fp8_gemm,
    m_grouped_fp8_gemm_masked,
    m_grouped_fp8_linear,
)
from torch_ascend_moe.ops.hc_prenorm import hc_prenorm_gemm
from torch_ascend_moe.ops.mega_moe import mega_moe
from torch_ascend_moe.ops.moe_routing import moe_gating_topk, moe_permute, moe_unpermute
from torch_ascend_moe.ops.mqa_logits import mqa_logits, mqa_topk, paged_mqa_logits, paged_mqa_logits_metadata

__all__ = [
    "bf16_bmm",
    "bf16_einsum",
    "bf16_gemm",
    "fp8_bmm",
    "fp8_einsum",
    "fp8_gemm",
    "fp8_linear",
    "fp8_quant_gemm",
    "hc_prenorm_gemm",
    "mega_moe",
    "k_grouped_bf16_gemm",
    "k_grouped_fp8_gemm",
    "m_grouped_bf16_gemm",
    "m_grouped_bf16_gemm_masked",
    "m_grouped_fp8_gemm",
    "m_grouped_fp8_gemm_masked",
    "m_grouped_fp8_linear",
    "moe_permute",
    "moe_unpermute",
    "moe_gating_topk",
    "mqa_logits",
    "mqa_topk",
    "paged_mqa_logits",
    "paged_mqa_logits_metadata",
]
