"""Ascend NPU kernels, on PrivateUse1 (which torch_npu renames to "npu").

The gemm family reaches torch_npu's matmul (ACLNN, FP32 accumulation) through the portable torch-op
kernels; families with dedicated torch_npu ops (grouped matmul, MoE dispatch) add adapters to
``OVERRIDES``. Registered only after ``import torch_npu`` succeeded; nothing here has run on Ascend
hardware (see the README's verification table).
"""

from __future__ import annotations

from torch_ascend_moe.backends.portable import register_kernels

OVERRIDES: dict = {}


def register() -> None:
    register_kernels("PrivateUse1", OVERRIDES)
