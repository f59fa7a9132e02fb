// CPU kernels of the fp8_linear family: quantize high-precision inputs to FP8 E4M3 with the quant family's
// casts (quant.h, bit for bit deep_gemm.utils'), then run the fp8_gemm family's scaled GEMM on them. The
// quantized copies are transient; the caller keeps its BF16/FP32 tensors (the training master weights).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <torch/library.h>

#include <vector>

#include "fp8_gemm.h"
#include "fp8_linear_checks.h"
#include "quant.h"

namespace ascend_moe {

namespace {

at::Tensor fp8_quant_gemm_cpu(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                              const std::optional<at::Tensor>& c, int64_t gran_k, at::IntArrayRef recipe_b,
                              bool use_ue8m0, double alpha, std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] = fp8_linear::fp8_quant_gemm_signature(x, b, sfb, c, gran_k, recipe_b, out_dtype);
  at::Tensor out = at::empty(shape, x.options().dtype(out_t));
  if (out.numel() == 0) return out;
  const auto [q, sf] = quantize_blocks(x, 1, gran_k, use_ue8m0);
  fp8_products_into(out, c.value_or(at::Tensor()), [&](const at::Tensor& acc) {
    return std::vector<Fp8Job>{{acc, q, sf, b, sfb, {1, gran_k}, recipe_b.vec(), alpha}};
  });
  return out;
}

at::Tensor fp8_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          int64_t block, bool use_ue8m0, bool fp8_backward) {
  const std::vector<int64_t> shape = fp8_linear::fp8_linear_signature(x, weight, bias, block);
  at::Tensor out = at::empty(shape, x.options());
  if (out.numel() == 0) return out;
  // DeepSeek-V3's recipe: activations 1 x block per token, weights block x block.
  const auto [xq, xs] = quantize_blocks(x, 1, block, use_ue8m0);
  const auto [wq, ws] = quantize_blocks(weight, block, block, use_ue8m0);
  fp8_products_into(out, bias.value_or(at::Tensor()), [&](const at::Tensor& acc) {
    return std::vector<Fp8Job>{{acc, xq, xs, wq, ws, {1, block}, {block, block}}};
  });
  return out;
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- fp8_linear family: high-precision inputs quantized to FP8 inside the op, then fp8_gemm ----
  // Differentiable w.r.t. the high-precision inputs (straight-through estimator for the casts).
  m.set_python_module("torch_ascend_moe.fakes.fp8_linear");
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

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("fp8_quant_gemm", &fp8_quant_gemm_cpu);
  m.impl("fp8_linear", &fp8_linear_cpu);
}

}  // namespace ascend_moe
