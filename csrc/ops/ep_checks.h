// The ep family's C++ argument checks: those of its CPU helper kernels (ascend_moe_kernels::ep_combine_reduce,
// ep_dispatch_plan, ep_dispatch_unpack, elastic_handle_fields; the ep ops themselves are Python kernels, checked in
// Python alone). Twin: torch_ascend_moe/checks/ep.py (the same checks in the same order, the same words;
// tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <utility>

#include "checks.h"

namespace ascend_moe::ep {

constexpr const char* kReduce = "ep_combine_reduce";
constexpr const char* kPlan = "ep_dispatch_plan";
constexpr const char* kUnpack = "ep_dispatch_unpack";
constexpr const char* kHandle = "elastic_handle_fields";

// Checks an ep_combine_reduce call (its rows' values and `out` apart); returns the number of rows.
inline int64_t combine_reduce_signature(at::TensorList blocks, const at::Tensor& dest, int64_t num_tokens,
                                        const std::optional<at::Tensor>& bias_0,
                                        const std::optional<at::Tensor>& bias_1,
                                        const std::optional<at::Tensor>& visit) {
  AM_CHECK_ARG(!blocks.empty(), kReduce, "rows", "length", "at least one block", 0);
  const at::Tensor& first = blocks[0];
  const int64_t h = first.dim() == 2 ? first.size(1) : 0;
  int64_t n = 0;
  for (const at::Tensor& rows : blocks) {
    check_rank(kReduce, "rows", rows, 2, "[rows, hidden]");
    AM_CHECK_ARG(is_gemm_dtype(rows.scalar_type()), kReduce, "rows", "dtype", kGemmDtypes,
                 dtype_name(rows.scalar_type()));
    AM_CHECK_ARG(rows.scalar_type() == first.scalar_type(), kReduce, "rows", "dtype", dtype_name(first.scalar_type()),
                 dtype_name(rows.scalar_type()));
    AM_CHECK_ARG(rows.size(1) == h, kReduce, "rows", "size(1)", h, rows.size(1));
    AM_CHECK_ARG(rows.size(1) <= 1 || rows.stride(1) == 1, kReduce, "rows", "stride(1)", 1, rows.stride(1));
    n += rows.size(0);
  }
  check_rank(kReduce, "dest", dest, 1, "[rows]");
  AM_CHECK_ARG(dest.scalar_type() == at::kLong, kReduce, "dest", "dtype", "torch.int64",
               dtype_name(dest.scalar_type()));
  AM_CHECK_ARG(dest.size(0) == n, kReduce, "dest", "size(0)", n, dest.size(0));
  check_int_arg(kReduce, "num_tokens", num_tokens, 0);
  for (const auto& [name, b] : {std::pair{"bias_0", bias_0}, std::pair{"bias_1", bias_1}}) {
    if (b.has_value()) {
      AM_CHECK_ARG(b->dim() == 2 && b->size(0) == num_tokens && b->size(1) == h, kReduce, name, "shape",
                   shape_str({num_tokens, h}), shape_str(b->sizes()));
    }
  }
  if (visit.has_value()) {
    check_rank(kReduce, "visit", *visit, 1, "[rows]");
    AM_CHECK_ARG(visit->scalar_type() == at::kLong, kReduce, "visit", "dtype", "torch.int64",
                 dtype_name(visit->scalar_type()));
    AM_CHECK_ARG(visit->size(0) == n, kReduce, "visit", "size(0)", n, visit->size(0));
  }
  return n;
}

// The visiting order's values (a kernel's check; fakes cannot see values): row indices of the n rows.
inline void check_visit_values(const at::Tensor& visit, int64_t n) {
  const at::Tensor v = visit.contiguous();
  const int64_t* vp = v.const_data_ptr<int64_t>();
  for (int64_t q = 0; q < v.numel(); ++q) {
    AM_CHECK_ARG(vp[q] >= 0 && vp[q] < n, kReduce, "visit", "values", "row indices in [0, " + std::to_string(n) + ")",
                 vp[q]);
  }
}

// The destinations' values (a kernel's check): token indices, -1 for rows that add nowhere.
inline void check_dest_values(const at::Tensor& dest, int64_t num_tokens) {
  const at::Tensor d = dest.contiguous();
  const int64_t* dp = d.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < d.numel(); ++i) {
    AM_CHECK_ARG(dp[i] >= -1 && dp[i] < num_tokens, kReduce, "dest", "values",
                 "token indices in [-1, " + std::to_string(num_tokens) + ")", dp[i]);
  }
}

// The .out overload's `out`: contiguous [num_tokens, H] in the rows' dtype.
inline void check_reduce_out(const at::Tensor& out, const at::Tensor& rows, int64_t num_tokens, int64_t h) {
  AM_CHECK_ARG(out.scalar_type() == rows.scalar_type(), kReduce, "out", "dtype", dtype_name(rows.scalar_type()),
               dtype_name(out.scalar_type()));
  AM_CHECK_ARG(out.dim() == 2 && out.size(0) == num_tokens && out.size(1) == h && out.is_contiguous(), kReduce, "out",
               "shape", "contiguous " + shape_str({num_tokens, h}), shape_str(out.sizes()));
}

// Checks an ep_dispatch_plan call.
inline void dispatch_plan_signature(const at::Tensor& topk_idx, int64_t num_experts, int64_t num_ranks,
                                    const std::optional<at::Tensor>& x_scales,
                                    const std::optional<at::Tensor>& topk_weights) {
  check_rank(kPlan, "topk_idx", topk_idx, 2, "[T, K]");
  check_int_arg(kPlan, "num_experts", num_experts, 1);
  check_int_arg(kPlan, "num_ranks", num_ranks, 1);
  AM_CHECK_ARG(num_experts % num_ranks == 0, kPlan, "num_experts", "value", "a multiple of num_ranks", num_experts);
  AM_CHECK_ARG(topk_idx.scalar_type() == at::kLong || topk_idx.scalar_type() == at::kInt, kPlan, "topk_idx", "dtype",
               "torch.int64 or torch.int32", dtype_name(topk_idx.scalar_type()));
  if (x_scales.has_value()) {
    check_rank(kPlan, "x_scales", *x_scales, 2, "[T, S]");
    AM_CHECK_ARG(x_scales->size(0) == topk_idx.size(0), kPlan, "x_scales", "size(0)", topk_idx.size(0),
                 x_scales->size(0));
  }
  if (topk_weights.has_value()) {
    AM_CHECK_ARG(topk_weights->sizes() == topk_idx.sizes(), kPlan, "topk_weights", "shape",
                 shape_str(topk_idx.sizes()), shape_str(topk_weights->sizes()));
  }
}

// Checks an ep_dispatch_unpack call.
inline void dispatch_unpack_signature(const at::Tensor& meta, int64_t scale_bytes, int64_t k, int64_t weight_size,
                                      int64_t local_experts, int64_t alignment) {
  check_rank(kUnpack, "meta", meta, 2, "[N, W]");
  AM_CHECK_ARG(meta.scalar_type() == at::kByte, kUnpack, "meta", "dtype", "torch.uint8",
               dtype_name(meta.scalar_type()));
  check_int_arg(kUnpack, "scale_bytes", scale_bytes, 0);
  check_int_arg(kUnpack, "k", k, 0);
  check_int_arg(kUnpack, "weight_size", weight_size, 0);
  check_int_arg(kUnpack, "local_experts", local_experts, 1);
  check_int_arg(kUnpack, "alignment", alignment, 1);
  const int64_t used = scale_bytes + k * 8 + k * weight_size, width = used + (8 - used % 8) % 8 + 8;
  AM_CHECK_ARG(meta.size(1) == width, kUnpack, "meta", "size(1)", width, meta.size(1));
}

// Checks an elastic_handle_fields call.
inline void handle_fields_signature(const at::Tensor& recv_counts, const at::Tensor& recv_topk_idx,
                                    const at::Tensor& topk_idx, int64_t num_scaleup_ranks, int64_t local_experts) {
  check_rank(kHandle, "recv_topk_idx", recv_topk_idx, 2, "[N, K]");
  check_rank(kHandle, "topk_idx", topk_idx, 2, "[T, K]");
  check_int_arg(kHandle, "num_scaleup_ranks", num_scaleup_ranks, 1);
  check_int_arg(kHandle, "local_experts", local_experts, 1);
  AM_CHECK_ARG(recv_counts.numel() % num_scaleup_ranks == 0, kHandle, "num_scaleup_ranks", "value",
               "a divisor of the ranks", recv_counts.numel());
}

}  // namespace ascend_moe::ep
