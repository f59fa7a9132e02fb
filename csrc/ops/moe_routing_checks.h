// The moe_routing family's argument checks (moe_permute, moe_unpermute, moe_gating_topk). Twin:
// torch_ascend_moe/checks/moe_routing.py (the same checks in the same order, the same words;
// tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <optional>
#include <string>

#include "checks.h"

namespace ascend_moe::moe_routing {

constexpr const char* kPermute = "ascend_moe::moe_permute";
constexpr const char* kUnpermute = "ascend_moe::moe_unpermute";
constexpr const char* kGating = "ascend_moe::moe_gating_topk";
constexpr const char* kPermuteRows =
    "small enough that the T * k + (num_experts - 1) * (alignment - 1) output rows fit in int32";

// Rows of moe_permute's output: every routed pair plus the most alignment padding E segments can need.
inline int64_t permute_capacity(int64_t tokens, int64_t topk, int64_t experts, int64_t alignment) {
  return tokens * topk + std::max<int64_t>(experts - 1, 0) * (alignment - 1);
}

// Checks a moe_permute call; returns the output's rows.
inline int64_t permute_signature(const at::Tensor& x, const at::Tensor& topk_idx, int64_t num_experts,
                                 int64_t alignment) {
  const char* op = kPermute;
  check_rank(op, "x", x, 2, "[T, H]");
  AM_CHECK_ARG(is_gemm_dtype(x.scalar_type()), op, "x", "dtype", kGemmDtypes, dtype_name(x.scalar_type()));
  check_rank(op, "topk_idx", topk_idx, 2, "[T, k]");
  AM_CHECK_ARG(topk_idx.scalar_type() == at::kInt || topk_idx.scalar_type() == at::kLong, op, "topk_idx", "dtype",
               "torch.int32 or torch.int64", dtype_name(topk_idx.scalar_type()));
  AM_CHECK_ARG(topk_idx.device() == x.device(), op, "topk_idx", "device", x.device().str() + " (same as 'x')",
               topk_idx.device().str());
  check_dim_size(op, "topk_idx", topk_idx, 0, "T", x.size(0), "x.size(0)");
  check_int_arg(op, "num_experts", num_experts, 1);
  check_int_arg(op, "alignment", alignment, 1);
  const int64_t capacity = permute_capacity(x.size(0), topk_idx.size(1), num_experts, alignment);
  // row_map and offs hold output rows as int32.
  AM_CHECK_ARG(capacity <= kMaxIntArg, op, "alignment", "value", kPermuteRows, alignment);
  return capacity;
}

// Checks a moe_unpermute call.
inline void unpermute_signature(const at::Tensor& y, const at::Tensor& row_map,
                                const std::optional<at::Tensor>& topk_weights, const std::optional<at::Tensor>& bias) {
  const char* op = kUnpermute;
  check_rank(op, "y", y, 2, "[R, H]");
  AM_CHECK_ARG(is_gemm_dtype(y.scalar_type()), op, "y", "dtype", kGemmDtypes, dtype_name(y.scalar_type()));
  check_rank(op, "row_map", row_map, 2, "[T, k]");
  AM_CHECK_ARG(row_map.scalar_type() == at::kInt, op, "row_map", "dtype", "torch.int32",
               dtype_name(row_map.scalar_type()));
  AM_CHECK_ARG(row_map.device() == y.device(), op, "row_map", "device", y.device().str() + " (same as 'y')",
               row_map.device().str());
  if (topk_weights.has_value()) {
    const at::Tensor& w = *topk_weights;
    AM_CHECK_ARG(w.sizes() == row_map.sizes(), op, "topk_weights", "shape",
                 shape_str(row_map.sizes()) + " (row_map's shape)", shape_str(w.sizes()));
    AM_CHECK_ARG(is_gemm_dtype(w.scalar_type()), op, "topk_weights", "dtype", kGemmDtypes,
                 dtype_name(w.scalar_type()));
    AM_CHECK_ARG(w.device() == y.device(), op, "topk_weights", "device", y.device().str() + " (same as 'y')",
                 w.device().str());
  }
  if (bias.has_value()) {
    const at::Tensor& b = *bias;
    const int64_t t = row_map.size(0), h = y.size(1);
    AM_CHECK_ARG(b.dim() == 2 && b.size(0) == t && b.size(1) == h, op, "bias", "shape",
                 shape_str({t, h}) + " (row_map.size(0), y.size(1))", shape_str(b.sizes()));
    AM_CHECK_ARG(is_gemm_dtype(b.scalar_type()), op, "bias", "dtype", kGemmDtypes, dtype_name(b.scalar_type()));
    AM_CHECK_ARG(b.device() == y.device(), op, "bias", "device", y.device().str() + " (same as 'y')",
                 b.device().str());
  }
}

// Checks a moe_gating_topk call; returns the dtype scores and weights are computed in.
inline at::ScalarType gating_signature(const at::Tensor& logits, int64_t topk, const std::optional<at::Tensor>& bias,
                                       c10::string_view score_func, int64_t num_groups, int64_t topk_groups) {
  const char* op = kGating;
  check_rank(op, "logits", logits, 2, "[T, E]");
  AM_CHECK_ARG(is_gemm_dtype(logits.scalar_type()), op, "logits", "dtype", kGemmDtypes,
               dtype_name(logits.scalar_type()));
  const int64_t e = logits.size(1);
  AM_CHECK_ARG(score_func == "softmax" || score_func == "sigmoid", op, "score_func", "value",
               "'softmax' or 'sigmoid'", "'" + std::string(score_func) + "'");
  AM_CHECK_ARG(e > 0, op, "logits", "size(1) (E)", "a positive number of experts", e);
  AM_CHECK_ARG(num_groups > 0 && e % num_groups == 0, op, "num_groups", "value",
               "a positive divisor of the expert count " + std::to_string(e), num_groups);
  AM_CHECK_ARG(topk_groups > 0 && topk_groups <= num_groups, op, "topk_groups", "value",
               "in [1, num_groups=" + std::to_string(num_groups) + "]", topk_groups);
  AM_CHECK_ARG(topk > 0 && topk <= e, op, "topk", "value", "in [1, " + std::to_string(e) + "] (the expert count)",
               topk);
  if (bias.has_value()) {
    const at::Tensor& b = *bias;
    check_rank(op, "bias", b, 1, "[E]");
    check_dim_size(op, "bias", b, 0, "E", e, "logits.size(1)");
    AM_CHECK_ARG(b.scalar_type() == at::kFloat || b.scalar_type() == at::kDouble, op, "bias", "dtype",
                 "torch.float32 or torch.float64", dtype_name(b.scalar_type()));
    AM_CHECK_ARG(b.device() == logits.device(), op, "bias", "device", logits.device().str() + " (same as 'logits')",
                 b.device().str());
  }
  return logits.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// The values of an int32 / int64 [T, k] id tensor (a kernel's check; fakes cannot see values): each in [-1, high).
inline void check_range(const char* op, const char* arg, const at::Tensor& values, int64_t high, const char* what) {
  const at::Tensor v = values.contiguous();
  const int64_t n = v.numel(), k = n ? v.size(1) : 1;
  const bool wide = v.scalar_type() == at::kLong;
  const int64_t* longs = wide ? v.const_data_ptr<int64_t>() : nullptr;
  const int32_t* ints = wide ? nullptr : v.const_data_ptr<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = wide ? longs[i] : ints[i];
    AM_CHECK_ARG(id >= -1 && id < high, op, arg, "values",
                 std::string(what) + " in [-1, " + std::to_string(high) + ") (-1 = not routed)",
                 std::string(arg) + "[" + std::to_string(i / k) + ", " + std::to_string(i % k) + "] = " +
                     std::to_string(id));
  }
}

}  // namespace ascend_moe::moe_routing
