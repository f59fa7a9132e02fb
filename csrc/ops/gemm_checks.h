// The gemm family's argument checks (bf16_gemm, bf16_bmm, bf16_einsum). Twin: torch_ascend_moe/checks/gemm.py
// (the same checks in the same order, the same words; tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checks.h"

namespace ascend_moe::gemm {

constexpr const char* kGemm = "ascend_moe::bf16_gemm";
constexpr const char* kBmm = "ascend_moe::bf16_bmm";
constexpr const char* kEinsum = "ascend_moe::bf16_einsum";

// The supported equations; each is a batched GEMM on permuted views (see bf16_einsum_cpu).
constexpr std::array<const char*, 4> kEquations{"bmk,bnk->mn", "bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr"};

// The output shape and dtype of a call.
using Signature = std::pair<std::vector<int64_t>, at::ScalarType>;

inline std::string supported_equations() {
  std::string s = "one of";
  for (size_t i = 0; i < kEquations.size(); ++i) s += std::string(i ? ", '" : " '") + kEquations[i] + "'";
  return s;
}

inline Signature gemm_signature(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                                std::optional<at::ScalarType> out_dtype) {
  check_rank(kGemm, "a", a, 2, "[M, K]");
  check_rank(kGemm, "b", b, 2, "[N, K]");
  check_operand_dtypes(kGemm, a, b);
  check_same_device(kGemm, "b", b, a);
  check_dim_size(kGemm, "b", b, 1, "K", a.size(1), "a.size(1)");
  const at::ScalarType dtype = resolve_out_dtype(kGemm, a, c, out_dtype);
  std::vector<int64_t> shape{a.size(0), b.size(0)};
  check_accumulator(kGemm, c, a, shape);
  return {shape, dtype};
}

inline Signature bmm_signature(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                               std::optional<at::ScalarType> out_dtype) {
  check_rank(kBmm, "a", a, 3, "[B, M, K]");
  check_rank(kBmm, "b", b, 3, "[B, N, K]");
  check_operand_dtypes(kBmm, a, b);
  check_same_device(kBmm, "b", b, a);
  check_dim_size(kBmm, "b", b, 0, "batch", a.size(0), "a.size(0)");
  check_dim_size(kBmm, "b", b, 2, "K", a.size(2), "a.size(2)");
  const at::ScalarType dtype = resolve_out_dtype(kBmm, a, c, out_dtype);
  std::vector<int64_t> shape{a.size(0), a.size(1), b.size(1)};
  check_accumulator(kBmm, c, a, shape);
  return {shape, dtype};
}

// Checks ranks and that every subscript letter has one size across a and b.
inline Signature einsum_signature(const std::string& equation, const at::Tensor& a, const at::Tensor& b,
                                  const std::optional<at::Tensor>& c, std::optional<at::ScalarType> out_dtype) {
  AM_CHECK_ARG(std::find(kEquations.begin(), kEquations.end(), equation) != kEquations.end(), kEinsum,
               "equation", "value", supported_equations(), "'" + equation + "'");
  const std::string sa = equation.substr(0, 3), sb = equation.substr(4, 3), so = equation.substr(9);
  check_rank(kEinsum, "a", a, 3, ("[" + sa + "]").c_str());
  check_rank(kEinsum, "b", b, 3, ("[" + sb + "]").c_str());
  check_operand_dtypes(kEinsum, a, b);
  check_same_device(kEinsum, "b", b, a);
  for (int64_t j = 0; j < 3; ++j) {
    const auto i = sa.find(sb[j]);
    if (i != std::string::npos) {
      check_dim_size(kEinsum, "b", b, j, std::string("'") + sb[j] + "'", a.size(i),
                     "a.size(" + std::to_string(i) + ")");
    }
  }
  const at::ScalarType dtype = resolve_out_dtype(kEinsum, a, c, out_dtype);
  std::vector<int64_t> shape;
  for (char l : so) {
    const auto i = sa.find(l);
    shape.push_back(i != std::string::npos ? a.size(i) : b.size(sb.find(l)));
  }
  check_accumulator(kEinsum, c, a, shape);
  return {shape, dtype};
}

}  // namespace ascend_moe::gemm
