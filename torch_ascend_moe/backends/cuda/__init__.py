"""CUDA kernels: the portable torch-op kernels (cuBLAS, FP32 accumulation) on the CUDA dispatch key.

Registered by ``torch_ascend_moe.backends.register_available`` when torch is built with CUDA. Families
with Triton kernels add them to ``OVERRIDES``.
"""

from __future__ import annotations

from torch_ascend_moe.backends.portable import register_kernels

OVERRIDES: dict = {}


def register() -> None:
    register_kernels("CUDA", OVERRIDES)
