// The swiglu family's argument checks (swiglu_forward, swiglu_backward). Twin: torch_ascend_moe/checks/swiglu.py
// (the same checks in the same order, the same words; tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "checks.h"

namespace ascend_moe::swiglu {

constexpr const char* kForward = "ascend_moe::swiglu_forward";
constexpr const char* kBackward = "ascend_moe::swiglu_backward";
constexpr const char* kFloatDtypes = "torch.bfloat16, torch.float32 or torch.float64";

inline bool is_float_dtype(at::ScalarType t) { return t == at::kBFloat16 || t == at::kFloat || t == at::kDouble; }

inline at::ScalarType compute_type(const at::Tensor& x, const at::Tensor* g = nullptr) {
  const bool fp64 = x.scalar_type() == at::kDouble || (g != nullptr && g->scalar_type() == at::kDouble);
  return fp64 ? at::kDouble : at::kFloat;
}

inline std::pair<int64_t, int64_t> check_x(const char* op, const at::Tensor& x, bool quantized_ok) {
  check_rank(op, "x", x, 2, "[N, 2H] (gate half, then up half)");
  const at::ScalarType t = x.scalar_type();
  AM_CHECK_ARG(is_float_dtype(t) || (quantized_ok && t == at::kFloat8_e4m3fn), op, "x", "dtype",
               quantized_ok ? "torch.bfloat16, torch.float32, torch.float64 or torch.float8_e4m3fn" : kFloatDtypes,
               dtype_name(t));
  const int64_t two_h = x.size(1);
  AM_CHECK_ARG(two_h % 2 == 0 && two_h > 0, op, "x", "size(1)", "an even number 2H > 0 ([a | b] halves)", two_h);
  return {x.size(0), two_h / 2};
}

inline void check_same_device_as(const char* op, const char* arg, const at::Tensor& t, const at::Tensor& ref) {
  AM_CHECK_ARG(t.device() == ref.device(), op, arg, "device", ref.device().str() + " (same as 'x')",
               t.device().str());
}

inline void check_routing(const char* op, const std::optional<at::Tensor>& w, const std::optional<at::Tensor>& psum,
                          int64_t alignment, std::optional<double> scale, std::optional<double> clamp,
                          const at::Tensor& ref, int64_t rows) {
  if (w.has_value()) {
    check_rank(op, "topk_weights", *w, 1, "[N] (one weight per expanded row)");
    const bool fp64 = compute_type(ref) == at::kDouble;
    const at::ScalarType t = w->scalar_type();
    AM_CHECK_ARG(t == at::kFloat || (fp64 && t == at::kDouble), op, "topk_weights", "dtype",
                 fp64 ? "torch.float32 or torch.float64" : "torch.float32", dtype_name(t));
    check_same_device_as(op, "topk_weights", *w, ref);
    check_dim_size(op, "topk_weights", *w, 0, "N", rows, "x.size(0)");
  }
  if (psum.has_value()) {
    check_rank(op, "psum_num_tokens_per_expert", *psum, 1, "[E] (cumulative expert ends)");
    AM_CHECK_ARG(psum->scalar_type() == at::kInt, op, "psum_num_tokens_per_expert", "dtype", "torch.int32",
                 dtype_name(psum->scalar_type()));
    check_same_device_as(op, "psum_num_tokens_per_expert", *psum, ref);
  }
  check_int_arg(op, "alignment", alignment, 1);
  AM_CHECK_ARG(!scale.has_value() || w.has_value(), op, "routed_scaling_factor", "presence",
               "None without 'topk_weights'", float_text(scale.value_or(0)));
  AM_CHECK_ARG(!clamp.has_value() || (*clamp > 0 && *clamp < std::numeric_limits<double>::infinity()), op,
               "clamp_value", "value", "None or a positive finite float", float_text(clamp.value_or(0)));
}

// Checks a swiglu_forward call; returns the output dtype.
inline at::ScalarType forward_signature(const at::Tensor& x, const std::optional<at::Tensor>& topk_weights,
                                        const std::optional<at::Tensor>& psum, int64_t alignment,
                                        std::optional<double> routed_scaling_factor, std::optional<double> clamp_value,
                                        std::optional<at::ScalarType> out_dtype, int64_t num_per_channels,
                                        std::optional<double> sf_clamp_min) {
  const auto [n, h] = check_x(kForward, x, false);
  check_routing(kForward, topk_weights, psum, alignment, routed_scaling_factor, clamp_value, x, n);
  const at::ScalarType out_t = out_dtype.value_or(compute_type(x));
  AM_CHECK_ARG(is_float_dtype(out_t) || out_t == at::kFloat8_e4m3fn, kForward, "out_dtype", "value",
               "None, torch.float32, torch.bfloat16, torch.float64 or torch.float8_e4m3fn (the per-token cast)",
               dtype_name(out_t));
  check_int_arg(kForward, "num_per_channels", num_per_channels, 1);
  AM_CHECK_ARG(!sf_clamp_min.has_value() ||
                   (*sf_clamp_min > 0 && *sf_clamp_min < std::numeric_limits<double>::infinity()),
               kForward, "sf_clamp_min", "value", "None or a positive finite float",
               float_text(sf_clamp_min.value_or(0)));
  return out_t;
}

// The columns each of x_sf's scales covers (2H / x_sf.size(1)); 0 for an unquantized x.
inline int64_t x_scale_block(const at::Tensor& x, const std::optional<at::Tensor>& x_sf) {
  if (x.scalar_type() != at::kFloat8_e4m3fn) {
    AM_CHECK_ARG(!x_sf.has_value(), kBackward, "x_sf", "presence", "None for a " + dtype_name(x.scalar_type()) + " x",
                 "a tensor");
    return 0;
  }
  AM_CHECK_ARG(x_sf.has_value(), kBackward, "x_sf", "presence", "given with an E4M3 x (its per-row block scales)",
               "None");
  const at::Tensor& sf = *x_sf;
  check_rank(kBackward, "x_sf", sf, 2, "[N, 2H / block] (FP32 per-row block scales)");
  AM_CHECK_ARG(sf.scalar_type() == at::kFloat, kBackward, "x_sf", "dtype", "torch.float32",
               dtype_name(sf.scalar_type()));
  check_same_device_as(kBackward, "x_sf", sf, x);
  check_dim_size(kBackward, "x_sf", sf, 0, "N", x.size(0), "x.size(0)");
  const int64_t two_h = x.size(1), s = sf.size(1);
  AM_CHECK_ARG(s > 0 && two_h % s == 0, kBackward, "x_sf", "size(1)",
               "a divisor of 2H=" + std::to_string(two_h) + " (equal blocks of x's columns)", s);
  return two_h / s;
}

// Checks a swiglu_backward call; returns the output dtype.
inline at::ScalarType backward_signature(const at::Tensor& x, const std::optional<at::Tensor>& x_sf,
                                         const at::Tensor& grad_out, const std::optional<at::Tensor>& topk_weights,
                                         const std::optional<at::Tensor>& psum, int64_t alignment,
                                         std::optional<double> routed_scaling_factor,
                                         std::optional<double> clamp_value, std::optional<at::ScalarType> out_dtype,
                                         int64_t num_per_channels) {
  const auto [n, h] = check_x(kBackward, x, true);
  x_scale_block(x, x_sf);
  check_rank(kBackward, "grad_out", grad_out, 2, "[N, H]");
  AM_CHECK_ARG(is_float_dtype(grad_out.scalar_type()), kBackward, "grad_out", "dtype", kFloatDtypes,
               dtype_name(grad_out.scalar_type()));
  check_same_device_as(kBackward, "grad_out", grad_out, x);
  AM_CHECK_ARG(grad_out.size(0) == n && grad_out.size(1) == h, kBackward, "grad_out", "shape",
               shape_str({n, h}) + " (x's rows, H)", shape_str(grad_out.sizes()));
  const bool fp8_x = x.scalar_type() == at::kFloat8_e4m3fn;
  check_routing(kBackward, topk_weights, psum, alignment, routed_scaling_factor, clamp_value, fp8_x ? grad_out : x,
                n);
  const at::ScalarType out_t = out_dtype.value_or(grad_out.scalar_type());
  AM_CHECK_ARG(is_float_dtype(out_t), kBackward, "out_dtype", "value", std::string("None or ") + kFloatDtypes,
               dtype_name(out_t));
  check_int_arg(kBackward, "num_per_channels", num_per_channels, 0);
  return out_t;
}

// The psum layout's values (a kernel's check; fakes cannot see values): nondecreasing, and every expert's rows
// [align(psum[e-1]), psum[e]) inside x's rows (an empty expert may end anywhere up to its aligned start, as
// TileKernels' and DeepEP V2's layouts write them).
inline void check_layout_values(const char* op, const std::optional<at::Tensor>& psum, int64_t alignment,
                                int64_t rows) {
  if (!psum.has_value()) return;
  const at::Tensor ends = psum->contiguous();
  const int32_t* e = ends.const_data_ptr<int32_t>();
  int64_t prev = 0;
  for (int64_t i = 0; i < ends.numel(); ++i) {
    const int64_t end = e[i], start = (prev + alignment - 1) / alignment * alignment;
    AM_CHECK_ARG(end >= prev && (end <= rows || end <= start), op, "psum_num_tokens_per_expert", "values",
                 "nondecreasing cumulative expert ends, expert e's rows [align(psum[e-1], alignment=" +
                     std::to_string(alignment) + "), psum[e]) within x's " + std::to_string(rows) + " rows",
                 "psum[" + std::to_string(i) + "] = " + std::to_string(end) + " (after " + std::to_string(prev) +
                     ")");
    prev = end;
  }
}

}  // namespace ascend_moe::swiglu
