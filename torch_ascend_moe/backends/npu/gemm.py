"""The gemm family on Ascend: ``bf16_gemm``, ``bf16_bmm`` and ``bf16_einsum`` stay on their portable kernels; no
adapter is registered. The portable kernel is already the CANN kernel: ``torch.matmul`` / ``baddbmm`` on an NPU
tensor is torch_npu's ACLNN matmul, which multiplies BF16/FP16 with an FP32 accumulator and rounds once (the
portable kernel's BF16 path), our op's contract. The torch_npu-specific matmuls add nothing here: ``npu_linear`` is
``x @ w.T + b`` with the same kernel, ``npu_transpose_batchmatmul`` fuses a permute our einsum does not need, and
the quantized ones are the fp8_gemm family's (``backends/npu/fp8_gemm.py``).
"""

from torch_ascend_moe.backends.chain import stays_portable

stays_portable(
    "bf16_gemm",
    "bf16_bmm",
    "bf16_einsum",
    device="npu",
    why="torch.matmul / baddbmm on an NPU tensor is ACLNN's matmul: FP32 accumulator, one rounding, the op's contract",
)
