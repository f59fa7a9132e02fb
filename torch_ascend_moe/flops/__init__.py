"""FLOP formulas (``torch.utils.flop_counter``) of the GEMM-like ops, one module per family."""

from torch_ascend_moe.flops import (  # noqa: F401
    ep,
    fp8_gemm,
    fp8_linear,
    gemm,
    grouped,
    hc_prenorm,
    mega_moe,
    moe_routing,
    mqa_logits,
)
