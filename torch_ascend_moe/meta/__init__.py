"""Fake (meta) implementations of every ascend_moe op, one module per family.

``csrc/ops/library.cpp`` names each family's module in ``set_python_module``, so tracing an op before
its fakes are imported fails with a hint to import that module.
"""

from torch_ascend_moe.meta import (  # noqa: F401
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
