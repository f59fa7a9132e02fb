// The topk_select family's argument checks. Twin: torch_ascend_moe/checks/topk_select.py (the same checks in the
// same order, the same words; tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "checks.h"

namespace ascend_moe::topk_select {

constexpr const char* kOp = "ascend_moe::topk_select";

inline void check_index_vector(const char* name, const std::optional<at::Tensor>& t, const at::Tensor& input) {
  if (!t.has_value()) return;
  check_rank(kOp, name, *t, 1, "[b] (one per row)");
  AM_CHECK_ARG(t->scalar_type() == at::kInt, kOp, name, "dtype", "torch.int32", dtype_name(t->scalar_type()));
  AM_CHECK_ARG(t->device() == input.device(), kOp, name, "device", input.device().str() + " (same as 'input')",
               t->device().str());
  check_dim_size(kOp, name, *t, 0, "b", input.size(0), "input.size(0)");
}

// Checks the arguments; returns the indices' dtype.
inline at::ScalarType topk_select_signature(const at::Tensor& input, int64_t topk, const std::optional<at::Tensor>& end,
                                            const std::optional<at::Tensor>& output_idx_offset,
                                            std::optional<at::ScalarType> indices_dtype, int64_t idx_oob_fill_value) {
  check_rank(kOp, "input", input, 2, "[b, V]");
  AM_CHECK_ARG(is_gemm_dtype(input.scalar_type()), kOp, "input", "dtype",
               "torch.bfloat16, torch.float16, torch.float32 or torch.float64", dtype_name(input.scalar_type()));
  check_int_arg(kOp, "topk", topk, 1);
  check_index_vector("end", end, input);
  check_index_vector("output_idx_offset", output_idx_offset, input);
  const at::ScalarType idx_t = indices_dtype.value_or(at::kLong);
  AM_CHECK_ARG(idx_t == at::kInt || idx_t == at::kLong, kOp, "indices_dtype", "value",
               "None, torch.int32 or torch.int64", dtype_name(idx_t));
  AM_CHECK_ARG(idx_oob_fill_value >= std::numeric_limits<int32_t>::min() &&
                   idx_oob_fill_value <= std::numeric_limits<int32_t>::max(),
               kOp, "idx_oob_fill_value", "value", "a value in [-2147483648, 2147483647] (DeepSelect's int32 fill)",
               idx_oob_fill_value);
  return idx_t;
}

// 0 <= end[i] <= V (a kernel's check of values: fakes cannot see them); `end` is a contiguous int32 vector.
inline void check_end_values(const at::Tensor& end, int64_t columns) {
  const int32_t* ep = end.const_data_ptr<int32_t>();
  for (int64_t i = 0; i < end.numel(); ++i) {
    AM_CHECK_ARG(ep[i] >= 0 && ep[i] <= columns, kOp, "end", "values",
                 "0 <= end[i] <= V=" + std::to_string(columns) + " (input.size(1))",
                 "end[" + std::to_string(i) + "]=" + std::to_string(ep[i]));
  }
}

inline void nan_error(int64_t row, int64_t col) {
  AM_CHECK_ARG(false, kOp, "input", "values", "no NaN in input[i, :end[i]] (abort_when_nan_found=True)",
               "NaN at input[" + std::to_string(row) + ", " + std::to_string(col) + "]");
}

inline void offset_error(int64_t index, int64_t offset, int64_t row) {
  AM_CHECK_ARG(false, kOp, "output_idx_offset", "values", "index + output_idx_offset[i] within torch.int32",
               std::to_string(index) + " + " + std::to_string(offset) + " in row " + std::to_string(row));
}

}  // namespace ascend_moe::topk_select
