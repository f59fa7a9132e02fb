// The fp8_linear family's argument checks (fp8_quant_gemm, fp8_linear), and those the grouped family's ops that
// cast their own inputs share (m_grouped_fp8_linear, m_grouped_fp8_quant_gemm). Twin:
// torch_ascend_moe/checks/fp8_linear.py (the same checks in the same order, the same words;
// tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checks.h"
#include "fp8_gemm_checks.h"

namespace ascend_moe::fp8_linear {

constexpr const char* kQuantGemm = "ascend_moe::fp8_quant_gemm";
constexpr const char* kLinear = "ascend_moe::fp8_linear";

// A BF16/FP32 operand of `layout`'s rank: the inputs these ops cast themselves.
inline void check_high_precision(const char* op, const char* name, const at::Tensor& x, const char* layout) {
  check_rank(op, name, x, 2, layout);
  AM_CHECK_ARG(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, op, name, "dtype",
               "torch.bfloat16 or torch.float32", dtype_name(x.scalar_type()));
}

// `block` (the argument `arg`) is positive and divides x's K: the cast takes whole 1 x block groups.
inline void check_k_blocks(const char* op, const char* arg, int64_t block, const at::Tensor& x) {
  check_int_arg(op, arg, block, 1);
  AM_CHECK_ARG(x.size(1) % block == 0, op, "x", "size(1) (K)",
               std::string("a multiple of ") + arg + "=" + std::to_string(block), x.size(1));
}

inline fp8_gemm::Signature fp8_quant_gemm_signature(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                                                    const std::optional<at::Tensor>& c, int64_t gran_k,
                                                    at::IntArrayRef recipe_b,
                                                    std::optional<at::ScalarType> out_dtype) {
  check_high_precision(kQuantGemm, "x", x, "[M, K]");
  check_k_blocks(kQuantGemm, "gran_k", gran_k, x);
  fp8_gemm::check_fp8_operand(kQuantGemm, "b", "sfb", b, sfb, recipe_b, x, false);
  AM_CHECK_ARG(fp8_gemm::logical_k(b) == x.size(1), kQuantGemm, "b", "K", std::to_string(x.size(1)) + " (x's K)",
               fp8_gemm::logical_k(b));
  const at::ScalarType dtype = fp8_gemm::check_scaled_out_dtype(kQuantGemm, c, out_dtype, x.scalar_type());
  std::vector<int64_t> shape{x.size(0), b.size(0)};
  check_accumulator(kQuantGemm, c, x, shape);
  return {shape, dtype};
}

// Checks an fp8_linear call; returns the output shape.
inline std::vector<int64_t> fp8_linear_signature(const at::Tensor& x, const at::Tensor& weight,
                                                 const std::optional<at::Tensor>& bias, int64_t block) {
  check_high_precision(kLinear, "x", x, "[M, K]");
  check_rank(kLinear, "weight", weight, 2, "[N, K]");
  AM_CHECK_ARG(weight.scalar_type() == x.scalar_type(), kLinear, "weight", "dtype",
               dtype_name(x.scalar_type()) + " (same as 'x')", dtype_name(weight.scalar_type()));
  AM_CHECK_ARG(weight.device() == x.device(), kLinear, "weight", "device", x.device().str() + " (same as 'x')",
               weight.device().str());
  check_dim_size(kLinear, "weight", weight, 1, "K", x.size(1), "x.size(1)");
  check_k_blocks(kLinear, "block", block, x);
  const int64_t n = weight.size(0);
  if (bias.has_value()) {
    AM_CHECK_ARG(bias->dim() == 1 && bias->size(0) == n, kLinear, "bias", "shape",
                 "[" + std::to_string(n) + "] (weight.size(0))", shape_str(bias->sizes()));
    AM_CHECK_ARG(bias->scalar_type() == x.scalar_type(), kLinear, "bias", "dtype",
                 dtype_name(x.scalar_type()) + " (same as 'x')", dtype_name(bias->scalar_type()));
    AM_CHECK_ARG(bias->device() == x.device(), kLinear, "bias", "device", x.device().str() + " (same as 'x')",
                 bias->device().str());
  }
  return {x.size(0), n};
}

}  // namespace ascend_moe::fp8_linear
