"""CUDA kernels: the portable torch-op kernels (cuBLAS with FP32 accumulation) on the CUDA key.

Registered by ``torch_ascend_moe.backends.register_available`` when torch is built with CUDA.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.portable import gemm

KERNELS = {
    "bf16_gemm": gemm.bf16_gemm,
    "bf16_bmm": gemm.bf16_bmm,
    "bf16_einsum": gemm.bf16_einsum,
}

_lib: torch.library.Library | None = None


def register() -> None:
    global _lib
    _lib = torch.library.Library("ascend_moe", "IMPL")
    for name, fn in KERNELS.items():
        _lib.impl(name, fn, "CUDA")
