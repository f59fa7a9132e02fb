// The norm family's argument checks (rms_norm, rms_norm_quant, rms_norm_backward). Twin:
// torch_ascend_moe/checks/norm.py (the same checks in the same order, the same words;
// tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <cmath>
#include <optional>
#include <string>

#include "checks.h"

namespace ascend_moe::norm {

constexpr const char* kForward = "ascend_moe::rms_norm";
constexpr const char* kQuant = "ascend_moe::rms_norm_quant";
constexpr const char* kBackward = "ascend_moe::rms_norm_backward";
constexpr const char* kDtypes = "torch.bfloat16, torch.float32 or torch.float64";

inline bool is_norm_dtype(at::ScalarType t) { return t == at::kBFloat16 || t == at::kFloat || t == at::kDouble; }

inline at::ScalarType compute_type(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

// t (when given) has x's dtype, device and shape.
inline void check_like_x(const char* op, const char* name, const std::optional<at::Tensor>& t, const at::Tensor& x) {
  if (!t.has_value()) return;
  AM_CHECK_ARG(t->scalar_type() == x.scalar_type(), op, name, "dtype", dtype_name(x.scalar_type()) + " (same as 'x')",
               dtype_name(t->scalar_type()));
  AM_CHECK_ARG(t->device() == x.device(), op, name, "device", x.device().str() + " (same as 'x')", t->device().str());
  AM_CHECK_ARG(t->sizes().equals(x.sizes()), op, name, "shape", shape_str(x.sizes()) + " (x's)",
               shape_str(t->sizes()));
}

inline int64_t check_x_weight(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& weight) {
  AM_CHECK_ARG(x.dim() >= 1, op, "x", "rank", "at least 1-D [..., H]", std::to_string(x.dim()) + "-D");
  AM_CHECK_ARG(is_norm_dtype(x.scalar_type()), op, "x", "dtype", kDtypes, dtype_name(x.scalar_type()));
  const int64_t h = x.size(-1);
  AM_CHECK_ARG(h > 0, op, "x", "size(-1)", "a positive hidden size H", h);
  if (weight.has_value()) {
    const at::Tensor& w = *weight;
    check_rank(op, "weight", w, 1, "[H]");
    AM_CHECK_ARG(w.scalar_type() == x.scalar_type(), op, "weight", "dtype",
                 dtype_name(x.scalar_type()) + " (same as 'x')", dtype_name(w.scalar_type()));
    AM_CHECK_ARG(w.device() == x.device(), op, "weight", "device", x.device().str() + " (same as 'x')",
                 w.device().str());
    check_dim_size(op, "weight", w, 0, "H", h, "x.size(-1)");
  }
  return h;
}

inline void check_scale(const char* op, double out_scale) {
  AM_CHECK_ARG(std::isfinite(out_scale), op, "out_scale", "value", "a finite float", float_text(out_scale));
}

// Checks an rms_norm (or rms_norm_quant) call; returns H.
inline int64_t forward_signature(const char* op, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                 double eps, const std::optional<at::Tensor>& residual, double out_scale) {
  const int64_t h = check_x_weight(op, x, weight);
  AM_CHECK_ARG(std::isfinite(eps) && eps >= 0, op, "eps", "value", "a non-negative finite float", float_text(eps));
  check_scale(op, out_scale);
  check_like_x(op, "residual", residual, x);
  return h;
}

// Checks an rms_norm_quant call.
inline void quant_signature(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                            const std::optional<at::Tensor>& residual, double out_scale, int64_t num_per_channels) {
  forward_signature(kQuant, x, weight, eps, residual, out_scale);
  check_int_arg(kQuant, "num_per_channels", num_per_channels, 1);
}

// Checks an rms_norm_backward call.
inline void backward_signature(const at::Tensor& out_grad, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                               const at::Tensor& rstd, const std::optional<at::Tensor>& residual_out_grad,
                               double out_scale) {
  check_x_weight(kBackward, x, weight);
  check_like_x(kBackward, "out_grad", out_grad, x);
  check_like_x(kBackward, "residual_out_grad", residual_out_grad, x);
  const at::ScalarType want = compute_type(x);
  AM_CHECK_ARG(rstd.scalar_type() == want, kBackward, "rstd", "dtype", dtype_name(want),
               dtype_name(rstd.scalar_type()));
  const auto lead = x.sizes().slice(0, x.dim() - 1);
  AM_CHECK_ARG(rstd.sizes().equals(lead), kBackward, "rstd", "shape", shape_str(lead) + " (x's rows)",
               shape_str(rstd.sizes()));
  AM_CHECK_ARG(rstd.device() == x.device(), kBackward, "rstd", "device", x.device().str() + " (same as 'x')",
               rstd.device().str());
  check_scale(kBackward, out_scale);
}

}  // namespace ascend_moe::norm
