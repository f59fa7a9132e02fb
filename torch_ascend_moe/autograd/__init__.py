"""Backward formulas of the ascend_moe ops, one module per family (``torch.library.register_autograd``)."""

from torch_ascend_moe.autograd import (  # noqa: F401
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
