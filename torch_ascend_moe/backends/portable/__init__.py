"""Device-generic kernels written with torch ops: what the CUDA and NPU backends register.

They run on CPU too, which is how CI checks them against the C++ kernels and the fp64 references.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.portable import (
    ep,  # noqa: F401  (registers the ep kernels for every backend)
    fp8_gemm,
    fp8_linear,
    gemm,
    grouped,
    hc_prenorm,
    mega_moe,
    moe_routing,
    mqa_logits,
)

KERNELS = {
    "bf16_gemm": gemm.bf16_gemm,
    "bf16_bmm": gemm.bf16_bmm,
    "bf16_einsum": gemm.bf16_einsum,
    "fp8_gemm": fp8_gemm.fp8_gemm,
    "fp8_bmm": fp8_gemm.fp8_bmm,
    "fp8_einsum": fp8_gemm.fp8_einsum,
    "fp8_quant_gemm": fp8_linear.fp8_quant_gemm,
    "fp8_linear": fp8_linear.fp8_linear,
    "m_grouped_bf16_gemm": grouped.m_grouped_bf16_gemm,
    "m_grouped_bf16_gemm_masked": grouped.m_grouped_bf16_gemm_masked,
    "k_grouped_bf16_gemm": grouped.k_grouped_bf16_gemm,
    "m_grouped_fp8_gemm": grouped.m_grouped_fp8_gemm,
    "m_grouped_fp8_gemm_masked": grouped.m_grouped_fp8_gemm_masked,
    "m_grouped_fp8_linear": grouped.m_grouped_fp8_linear,
    "k_grouped_fp8_gemm": grouped.k_grouped_fp8_gemm,
    "moe_permute": moe_routing.moe_permute,
    "hc_prenorm_gemm": hc_prenorm.hc_prenorm_gemm,
    "moe_unpermute": moe_routing.moe_unpermute,
    "moe_gating_topk": moe_routing.moe_gating_topk,
    **ep.KERNELS,
    **mega_moe.KERNELS,
    "mqa_logits": mqa_logits.mqa_logits,
    "mqa_logits_backward": mqa_logits.mqa_logits_backward,
    "paged_mqa_logits": mqa_logits.paged_mqa_logits,
    "paged_mqa_logits_metadata": mqa_logits.paged_mqa_logits_metadata,
    "mqa_topk": mqa_logits.mqa_topk,
}

_libraries: dict[str, torch.library.Library] = {}


def register_kernels(dispatch_key: str, overrides: dict | None = None) -> None:
    """Register every portable kernel (or its device-specific override) on ``dispatch_key``, once."""
    if dispatch_key in _libraries:
        return
    lib = torch.library.Library("ascend_moe", "IMPL")
    for name, fn in (KERNELS | (overrides or {})).items():
        lib.impl(name, fn, dispatch_key)
    _libraries[dispatch_key] = lib
