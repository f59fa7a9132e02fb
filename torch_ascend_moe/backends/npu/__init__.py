"""Ascend NPU kernels (PrivateUse1 after torch_npu renames it to "npu").

The gemm family maps to torch_npu's matmul (ACLNN ``aclnnMatmul``/``aclnnBaddbmm``, FP32 accumulation),
reached through the portable torch-op kernels. Registered only after ``import torch_npu`` succeeded;
nothing here runs without Ascend hardware, see the README's verification table.
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
        _lib.impl(name, fn, "PrivateUse1")
