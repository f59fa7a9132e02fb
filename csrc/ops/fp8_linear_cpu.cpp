// CPU kernels of the fp8_linear family: quantize high-precision inputs to FP8 E4M3 with the quant family's
// casts (quant.h, bit for bit deep_gemm.utils'), then run the fp8_gemm family's scaled GEMM on them. The
// quantized copies are transient; the caller keeps its BF16/FP32 tensors (the training master weights).
#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <array>
#include <string>

#include "checks.h"
#include "fp8_gemm.h"
#include "fp8_linear.h"
#include "quant.h"

namespace ascend_moe {

void check_high_precision(const char* op, const char* name, const at::Tensor& x, const char* layout) {
  check_rank(op, name, x, 2, layout);
  AM_CHECK_ARG(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, op, name, "dtype",
               "torch.bfloat16 or torch.float32", dtype_name(x.scalar_type()));
}

void check_k_blocks(const char* op, const char* arg, int64_t block, const at::Tensor& x) {
  check_int_arg(op, arg, block, 1);
  AM_CHECK_ARG(x.size(1) % block == 0, op, "x", "size(1) (K)",
               std::string("a multiple of ") + arg + "=" + std::to_string(block), x.size(1));
}

namespace {

constexpr const char* kQuantGemm = "ascend_moe::fp8_quant_gemm";
constexpr const char* kLinear = "ascend_moe::fp8_linear";

at::Tensor fp8_quant_gemm_cpu(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                              const std::optional<at::Tensor>& c, int64_t gran_k, at::IntArrayRef recipe_b,
                              bool use_ue8m0, double alpha, std::optional<at::ScalarType> out_dtype) {
  check_high_precision(kQuantGemm, "x", x, "[M, K]");
  check_k_blocks(kQuantGemm, "gran_k", gran_k, x);
  fp8_gemm::check_fp8_operand(kQuantGemm, "b", "sfb", b, sfb, recipe_b, x, false);
  AM_CHECK_ARG(logical_k(b) == x.size(1), kQuantGemm, "b", "K", std::to_string(x.size(1)) + " (x's K)",
               logical_k(b));
  const at::ScalarType out_t = fp8_gemm::check_scaled_out_dtype(kQuantGemm, c, out_dtype, x.scalar_type());
  const std::array<int64_t, 2> shape{x.size(0), b.size(0)};
  check_accumulator(kQuantGemm, c, x, shape);
  return with_fp32_accumulator(shape, out_t, c.value_or(at::Tensor()), x.options(), [&](at::Tensor& acc) {
    const auto [q, sf] = quantize_blocks(x, 1, gran_k, use_ue8m0);
    const std::array<int64_t, 2> recipe_a{1, gran_k};
    fp8_gemm_accumulate(acc, q, sf, b, sfb, recipe_a, recipe_b, alpha);
  });
}

at::Tensor fp8_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          int64_t block, bool use_ue8m0, bool fp8_backward) {
  check_high_precision(kLinear, "x", x, "[M, K]");
  check_rank(kLinear, "weight", weight, 2, "[N, K]");
  AM_CHECK_ARG(weight.scalar_type() == x.scalar_type(), kLinear, "weight", "dtype",
               dtype_name(x.scalar_type()) + " (same as 'x')", dtype_name(weight.scalar_type()));
  AM_CHECK_ARG(weight.device() == x.device(), kLinear, "weight", "device", x.device().str() + " (same as 'x')",
               weight.device().str());
  check_dim_size(kLinear, "weight", weight, 1, "K", x.size(1), "x.size(1)");
  check_k_blocks(kLinear, "block", block, x);
  const int64_t M = x.size(0), N = weight.size(0);
  if (bias.has_value()) {
    AM_CHECK_ARG(bias->dim() == 1 && bias->size(0) == N, kLinear, "bias", "shape",
                 "[" + std::to_string(N) + "] (weight.size(0))", shape_str(bias->sizes()));
    AM_CHECK_ARG(bias->scalar_type() == x.scalar_type(), kLinear, "bias", "dtype",
                 dtype_name(x.scalar_type()) + " (same as 'x')", dtype_name(bias->scalar_type()));
    AM_CHECK_ARG(bias->device() == x.device(), kLinear, "bias", "device", x.device().str() + " (same as 'x')",
                 bias->device().str());
  }
  const std::array<int64_t, 2> shape{M, N};
  return with_fp32_accumulator(shape, x.scalar_type(), bias.value_or(at::Tensor()), x.options(),
                               [&](at::Tensor& acc) {
                                 // DeepSeek-V3's recipe: activations 1 x block per token, weights block x block.
                                 const auto [xq, xs] = quantize_blocks(x, 1, block, use_ue8m0);
                                 const auto [wq, ws] = quantize_blocks(weight, block, block, use_ue8m0);
                                 const std::array<int64_t, 2> recipe_x{1, block}, recipe_w{block, block};
                                 fp8_gemm_accumulate(acc, xq, xs, wq, ws, recipe_x, recipe_w, 1.0);
                               });
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
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

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("fp8_quant_gemm", &fp8_quant_gemm_cpu);
  m.impl("fp8_linear", &fp8_linear_cpu);
}

}  // namespace ascend_moe
