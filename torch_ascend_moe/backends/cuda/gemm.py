"""CUDA kernels of the gemm family: the portable kernels (cuBLAS through ATen) with one more native path: BF16/FP16
operands with an FP32 result (``out_dtype=torch.float32`` or an FP32 ``c``) take cuBLAS's FP32 accumulator directly
(``bmm``'s ``out_dtype``: tensor-core products, FP32 sums), then ``alpha`` and ``c`` in FP32 and one rounding,
instead of the portable kernel's FP32 copies of both operands through an FP32 (SIMT or TF32-free) GEMM. Same
values up to the FP32 summation order. A BF16/FP16 result is cuBLAS's BF16/FP16 GEMM with an FP32 accumulator,
as in the portable kernel; FP32/FP64 operands are the portable kernel's.
"""

from __future__ import annotations

from torch_ascend_moe.backends.chain import kernel
from torch_ascend_moe.backends.portable import gemm as portable


@kernel(device="cuda", library="aten", calls="cuBLAS: bmm(out_dtype=float32) for FP32 results")
def bf16_gemm(a, b, c, alpha, out_dtype):
    return portable.bf16_gemm(a, b, c, alpha, out_dtype, native_fp32_out=True)


@kernel(device="cuda", library="aten", calls="cuBLAS: bmm(out_dtype=float32) for FP32 results")
def bf16_bmm(a, b, c, alpha, out_dtype):
    return portable.bf16_bmm(a, b, c, alpha, out_dtype, native_fp32_out=True)


@kernel(device="cuda", library="aten", calls="cuBLAS: bmm(out_dtype=float32) for FP32 results")
def bf16_einsum(equation, a, b, c, alpha, out_dtype):
    return portable.bf16_einsum(equation, a, b, c, alpha, out_dtype, native_fp32_out=True)
