"""What PyTorch's own CPU GEMMs are on this machine: the choices between them and ours read it (``nn.moe``'s shared
experts, the ``grouped_mm`` and ``dense_gemm`` rewrites, transformers' ``eager`` experts under compilation, and the
passes' ``uuid()``, so the FX graph cache keys on it).

Where the CPU has BF16 (FP16) dot-product instructions (AVX512-BF16, AMX) PyTorch's BF16 (FP16) GEMMs are oneDNN's
native ones, as fast as ours (which call ATen's BF16 GEMM themselves there); without them oneDNN emulates the type
and ours, FP32 panels on MKL's SGEMM, is several times faster (``bench gemm``, ``bench grouped``: ATen's
``_grouped_mm`` in BF16 on an AVX2-only CPU is 90-300x slower than ``m_grouped_bf16_gemm``). Read once at import:
plain constants to ``torch.compile`` (Dynamo cannot trace ``torch.cpu``'s capability queries, and guards on these).
"""

from __future__ import annotations

import torch

NATIVE: dict[torch.dtype, bool] = {
    torch.bfloat16: torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported(),
    torch.float16: torch.cpu._is_amx_fp16_supported(),
}


def native(dtype: torch.dtype) -> bool:
    """Whether PyTorch's CPU GEMM of ``dtype`` (BF16 / FP16) multiplies it natively; False for other dtypes."""
    return NATIVE.get(dtype, False)


def emulated(dtype: torch.dtype) -> bool:
    """Whether ``dtype`` is BF16 / FP16 and PyTorch's CPU GEMM of it has no dot-product instructions (ours wins)."""
    return dtype in NATIVE and not NATIVE[dtype]
