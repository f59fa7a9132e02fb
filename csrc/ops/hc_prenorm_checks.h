// The hc_prenorm family's argument checks. Twin: torch_ascend_moe/checks/hc_prenorm.py (the same checks in the
// same order, the same words; tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "checks.h"

namespace ascend_moe::hc_prenorm {

constexpr const char* kOp = "ascend_moe::hc_prenorm_gemm";
constexpr int64_t kBlockK = 64;

// Checks the arguments; returns the accumulation (and output) dtype.
inline at::ScalarType hc_prenorm_signature(const at::Tensor& a, const at::Tensor& b,
                                           std::optional<int64_t> num_splits) {
  check_rank(kOp, "a", a, 2, "[M, K]");
  AM_CHECK_ARG(a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble,
               kOp, "a", "dtype", "torch.bfloat16, torch.float32 or torch.float64", dtype_name(a.scalar_type()));
  check_rank(kOp, "b", b, 2, "[N, K]");
  const at::ScalarType acc_t = a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  AM_CHECK_ARG(b.scalar_type() == acc_t, kOp, "b", "dtype",
               acc_t == at::kDouble ? "torch.float64 (with a float64 a)" : "torch.float32",
               dtype_name(b.scalar_type()));
  check_same_device(kOp, "b", b, a);
  check_dim_size(kOp, "b", b, 1, "K", a.size(1), "a.size(1)");
  AM_CHECK_ARG(a.size(1) % kBlockK == 0, kOp, "a", "size(1) (K)", "a multiple of 64", a.size(1));
  if (num_splits.has_value()) {
    AM_CHECK_ARG(*num_splits > 0, kOp, "num_splits", "value", "None or a positive integer", *num_splits);
    AM_CHECK_ARG(*num_splits <= kMaxIntArg, kOp, "num_splits", "value",
                 "at most 2147483647 (integer arguments are int32-sized)", *num_splits);
  }
  return acc_t;
}

}  // namespace ascend_moe::hc_prenorm
