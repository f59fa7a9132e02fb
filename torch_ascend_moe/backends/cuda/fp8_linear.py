"""CUDA kernels of the fp8_linear family: the portable kernels' steps through the dispatcher
(``portable.fp8_quant_gemm_steps`` / ``fp8_linear_steps``), so the GEMM runs ``fp8_gemm``'s CUDA kernel (the
block-scaled Triton kernel of ``_scaled_gemm``, where it takes the call) instead of the portable kernel's
dequantized FP32 copies; the casts are ``quantize_fp8``'s (bitwise the reference casts on every device). BF16
``fp8_linear`` without a bias asks the GEMM for BF16 directly (one rounding, the same bits). Not yet a fused
per-token cast inside the GEMM (issue 18's next step): the cast writes its FP8 copy of ``x`` first.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import cuda_kernel
from torch_ascend_moe.backends.portable import fp8_linear as portable

# The ops the steps call: the dispatcher (a CUDA tensor reaches each step's CUDA kernel); the tests put the CUDA
# kernels themselves here, as the dispatcher would route CUDA tensors to them, to run the composition on CPU.
OPS = torch.ops.ascend_moe


@cuda_kernel(calls="quantize_fp8 -> fp8_gemm (triton: _scaled_gemm)")
def fp8_quant_gemm(x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype):
    return portable.fp8_quant_gemm_steps(OPS, x, b, sfb, c, gran_k, recipe_b, use_ue8m0, alpha, out_dtype)


@cuda_kernel(calls="quantize_fp8 -> fp8_gemm (triton: _scaled_gemm)")
def fp8_linear(x, weight, bias, block, use_ue8m0, fp8_backward):
    return portable.fp8_linear_steps(OPS, x, weight, bias, block, use_ue8m0, fp8_backward)
