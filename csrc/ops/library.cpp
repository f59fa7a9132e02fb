// Every ascend_moe schema, in one table. Kernels live in <family>_cpu.cpp (CPU) and in the Python
// backends (CUDA, NPU); fakes and autograd formulas live in the Python package named below.
#include <torch/library.h>

TORCH_LIBRARY(ascend_moe, m) {
  // Each family names the module holding its fakes (it applies to the defs that follow), so tracing
  // before the fakes are imported fails with a hint naming that module.

  // ---- gemm family: D = alpha * A @ B^T + C over logical A[M, K], B[N, K] (any majorness) ----
  m.set_python_module("torch_ascend_moe.meta.gemm");
  m.def(
      "bf16_gemm(Tensor a, Tensor b, Tensor? c=None, float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "bf16_bmm(Tensor a, Tensor b, Tensor? c=None, float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "bf16_einsum(str equation, Tensor a, Tensor b, Tensor? c=None, float alpha=1., "
      "ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // ---- fp8_gemm family: D = alpha * deq(A) @ deq(B)^T + C with block scales (FP8 E4M3 or packed FP4) ----
  // deq(X)[r, k] = X[r, k] * sf[r // gran_mn, k // gran_k]; recipes are [gran_mn, gran_k] per operand.
  // FP4 operands are uint8 [MN, K / 2], two E2M1 codes per byte (low nibble first), K-major.
  m.set_python_module("torch_ascend_moe.meta.fp8_gemm");
  m.def(
      "fp8_gemm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor? c=None, int[2] recipe_a=[1, 128], "
      "int[2] recipe_b=[128, 128], float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}
