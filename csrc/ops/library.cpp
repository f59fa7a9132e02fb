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
  m.def(
      "fp8_bmm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor? c=None, int[2] recipe_a=[1, 128], "
      "int[2] recipe_b=[128, 128], float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Scales keep their operand's subscripts: h whole, the output letter / gran_mn, the contracted one / gran_k.
  m.def(
      "fp8_einsum(str equation, Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor? c=None, "
      "int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // ---- fp8_linear family: high-precision inputs quantized to FP8 inside the op, then fp8_gemm ----
  // Differentiable w.r.t. the high-precision inputs (straight-through estimator for the casts).
  m.set_python_module("torch_ascend_moe.meta.fp8_linear");
  // Inference: x [M, K] (BF16/FP32) cast per token in 1 x gran_k groups; b pre-quantized as in fp8_gemm.
  m.def(
      "fp8_quant_gemm(Tensor x, Tensor b, Tensor sfb, Tensor? c=None, int gran_k=128, "
      "int[2] recipe_b=[128, 128], bool use_ue8m0=False, float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Training: y = x @ weight^T + bias with x 1 x block per token and weight block x block (DeepSeek-V3);
  // fp8_backward picks FP8 (requantized gradients) or high-precision dgrad/wgrad GEMMs.
  m.def(
      "fp8_linear(Tensor x, Tensor weight, Tensor? bias=None, int block=128, bool use_ue8m0=False, "
      "bool fp8_backward=True) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}
