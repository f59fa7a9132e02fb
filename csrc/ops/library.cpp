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
}
