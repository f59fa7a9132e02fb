// The norm family: RMSNorm with the residual add, an output scale and the fused per-token FP8 cast, and its gradient,
// as TileKernels' Ascend-era norm_forward(_and_per_token_cast) / norm_backward compute them
// (specs/tilekernels_deepselect.md §10.4). Schemas, and the CPU kernels: one pass over each chunk of rows (residual
// add, squares, the row sums, the scaled output, the cast) where the device-generic kernel
// (torch_ascend_moe/backends/portable/norm.py) makes several passes over [..., H] tensors.
//
// The kernels compute the portable kernel's operations in its order on the contiguous rows, so results are equal
// bit for bit: each step one IEEE operation in the compute type (FP32, FP64 for FP64 x; no contraction into FMAs,
// see the pragma below), and the row sums, the column sums of the weight gradient and rsqrt are ATen's own CPU
// kernels (called on chunk buffers), so their order is torch's.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "norm_checks.h"
#include "rows.h"
#include "vector_clones.h"

// x_grad = (gw - x^ * mean) * rstd rounds the product before the difference, as the portable kernel's two ops: a
// compiler must not fuse them into one FMA (the AVX2 clones have FMA instructions).
#pragma GCC optimize("fp-contract=off")

namespace ascend_moe {
namespace {

constexpr float kE4M3AmaxFloor = 1e-4f;  // TileKernels' amax floor of the E4M3 cast

using norm::compute_type;

// ---- element loops (FP32 ones built for AVX2 too) ----

template <typename T>
inline void square_impl(const T* s, int64_t n, T* sq) {
  for (int64_t j = 0; j < n; ++j) sq[j] = s[j] * s[j];
}
AM_VECTOR_CLONES void square(const float* s, int64_t n, float* sq) { square_impl(s, n, sq); }
void square(const double* s, int64_t n, double* sq) { square_impl(s, n, sq); }

// y = s * rstd * scale (scale per column, or one value when `scales` is null).
template <typename T>
inline void scaled_impl(const T* s, int64_t h, T rstd, const T* scales, T scale, T* y) {
  if (scales != nullptr) {
    for (int64_t j = 0; j < h; ++j) y[j] = s[j] * rstd * scales[j];
  } else {
    for (int64_t j = 0; j < h; ++j) y[j] = s[j] * rstd * scale;
  }
}
AM_VECTOR_CLONES void scaled(const float* s, int64_t h, float rstd, const float* scales, float scale, float* y) {
  scaled_impl(s, h, rstd, scales, scale, y);
}
void scaled(const double* s, int64_t h, double rstd, const double* scales, double scale, double* y) {
  scaled_impl(s, h, rstd, scales, scale, y);
}

// The backward's first row pass: x^ = x * rstd, g = grad * out_scale, gw = g * weight (g without a weight),
// xgw = x^ * gw (the row sum's terms), xg = x^ * g (the weight gradient's terms, when wanted).
template <typename T>
inline void backward_terms_impl(const T* x, const T* grad, int64_t h, T rstd, T out_scale, const T* w, T* xhat, T* gw,
                                T* xgw, T* xg) {
  for (int64_t j = 0; j < h; ++j) {
    xhat[j] = x[j] * rstd;
    const T g = grad[j] * out_scale;
    gw[j] = w != nullptr ? g * w[j] : g;
    xgw[j] = xhat[j] * gw[j];
    if (xg != nullptr) xg[j] = xhat[j] * g;
  }
}
AM_VECTOR_CLONES void backward_terms(const float* x, const float* grad, int64_t h, float rstd, float out_scale,
                                     const float* w, float* xhat, float* gw, float* xgw, float* xg) {
  backward_terms_impl(x, grad, h, rstd, out_scale, w, xhat, gw, xgw, xg);
}
void backward_terms(const double* x, const double* grad, int64_t h, double rstd, double out_scale, const double* w,
                    double* xhat, double* gw, double* xgw, double* xg) {
  backward_terms_impl(x, grad, h, rstd, out_scale, w, xhat, gw, xgw, xg);
}

// x_grad = (gw - x^ * mean) * rstd (+ the residual's gradient): the product rounded, then the difference.
template <typename T>
inline void input_grad_impl(const T* xhat, const T* gw, int64_t h, T mean, T rstd, const T* extra, T* dx) {
  for (int64_t j = 0; j < h; ++j) {
    const T p = xhat[j] * mean;
    dx[j] = (gw[j] - p) * rstd;
  }
  if (extra != nullptr)
    for (int64_t j = 0; j < h; ++j) dx[j] = dx[j] + extra[j];
}
AM_VECTOR_CLONES void input_grad(const float* xhat, const float* gw, int64_t h, float mean, float rstd,
                                 const float* extra, float* dx) {
  input_grad_impl(xhat, gw, h, mean, rstd, extra, dx);
}
void input_grad(const double* xhat, const double* gw, int64_t h, double mean, double rstd, const double* extra,
                double* dx) {
  input_grad_impl(xhat, gw, h, mean, rstd, extra, dx);
}

// Row r of a contiguous [N, H] tensor of dtype BF16 / FP32 / FP64 into dst in the compute type (exact), and back
// (one rounding, as .to()).
template <typename acc_t>
void load(const at::Tensor& t, int64_t r, int64_t h, acc_t* dst) {
  load_values(t.scalar_type(), static_cast<const char*>(t.const_data_ptr()) + r * h * t.element_size(), h, dst);
}

template <typename acc_t>
void store(const acc_t* src, int64_t h, at::Tensor& t, int64_t r) {
  store_values(src, h, t.scalar_type(), static_cast<char*>(t.data_ptr()) + r * h * t.element_size());
}

// ATen's row sums of a chunk buffer [m, h] (torch's reduction order for a contiguous [..., H] tensor's last dim).
template <typename acc_t>
at::Tensor row_sums(acc_t* buffer, int64_t m, int64_t h) {
  return at::from_blob(buffer, {m, h}, at::TensorOptions().dtype(c10::CppTypeToScalarType<acc_t>::value)).sum(1);
}

// ---- forward ----

struct ForwardOutputs {
  at::Tensor out, rstd, residual_out, q, sf;  // q, sf: the E4M3 cast (undefined without one)
};

template <typename acc_t>
void forward_rows(const at::Tensor& x, const std::optional<at::Tensor>& residual,
                  const std::optional<at::Tensor>& weight, double eps, double out_scale, int64_t npc, bool round_sf,
                  ForwardOutputs& o) {
  const int64_t h = x.size(1), n = x.size(0);
  const at::ScalarType acc_type = c10::CppTypeToScalarType<acc_t>::value;
  // weight.to(acc) * out_scale, one rounding per column (no weight: out_scale itself, as a Python scalar meets a
  // tensor in its dtype).
  std::vector<acc_t> scales;
  if (weight.has_value()) {
    const at::Tensor w = weight->to(acc_type).contiguous();
    scales.resize(h);
    for (int64_t j = 0; j < h; ++j) scales[j] = w.const_data_ptr<acc_t>()[j] * static_cast<acc_t>(out_scale);
  }
  const acc_t scale = static_cast<acc_t>(out_scale);
  const acc_t h_acc = static_cast<acc_t>(h), eps_acc = static_cast<acc_t>(eps);
  const bool quant = o.q.defined();
  for_row_chunks(n, h, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<acc_t> buffer;
    thread_local std::vector<float> buffer32;
    const int64_t m = r1 - r0, count = m * h;
    acc_t* s = scratch(buffer, 2 * count + 2 * h);
    acc_t *sq = s + count, *y = sq + count, *r_row = y + h;
    float* y32 = quant ? scratch(buffer32, h) : nullptr;
    for (int64_t r = r0; r < r1; ++r) {
      acc_t* sr = s + (r - r0) * h;
      load(x, r, h, sr);
      if (residual.has_value()) {  // s = x + residual rounded to x's dtype: it is also residual_out
        load(*residual, r, h, r_row);
        for (int64_t j = 0; j < h; ++j) sr[j] = sr[j] + r_row[j];
        store(sr, h, o.residual_out, r);
        load(o.residual_out, r, h, sr);
      }
    }
    square(s, count, sq);
    at::Tensor rstd = row_sums(sq, m, h);
    acc_t* rs = rstd.data_ptr<acc_t>();
    for (int64_t i = 0; i < m; ++i) rs[i] = rs[i] / h_acc + eps_acc;
    rstd.rsqrt_();  // ATen's rsqrt, as the portable kernel's
    acc_t* rstd_out = o.rstd.data_ptr<acc_t>();
    for (int64_t r = r0; r < r1; ++r) {
      const acc_t rr = rs[r - r0];
      rstd_out[r] = rr;
      scaled(s + (r - r0) * h, h, rr, scales.empty() ? nullptr : scales.data(), scale, y);
      store(y, h, o.out, r);
      if (quant) {  // the cast takes the rounded output
        load(o.out, r, h, y);
        const float* src;
        if constexpr (std::is_same_v<acc_t, float>) {
          src = y;
        } else {
          for (int64_t j = 0; j < h; ++j) y32[j] = static_cast<float>(y[j]);
          src = y32;
        }
        cast_row_e4m3(src, h, npc, round_sf, kE4M3AmaxFloor,
                      reinterpret_cast<uint8_t*>(o.q.data_ptr<c10::Float8_e4m3fn>()) + r * h,
                      o.sf.data_ptr<float>() + r * o.sf.size(1));
      }
    }
  });
}

ForwardOutputs forward(const at::Tensor& x_in, const std::optional<at::Tensor>& weight, double eps,
                       const std::optional<at::Tensor>& residual_in, double out_scale, int64_t npc, bool round_sf,
                       bool quant) {
  const int64_t h = x_in.size(-1);
  const at::Tensor x = x_in.contiguous().view({-1, h});
  std::optional<at::Tensor> residual;
  if (residual_in.has_value()) residual = residual_in->contiguous().view({-1, h});
  const at::ScalarType acc = compute_type(x_in);
  const auto lead = x_in.sizes().slice(0, x_in.dim() - 1);
  ForwardOutputs o;
  o.out = at::empty(x_in.sizes(), x_in.options());
  o.rstd = at::empty(lead, x_in.options().dtype(acc));
  o.residual_out = residual.has_value() ? at::empty(x_in.sizes(), x_in.options()) : at::empty({0}, x_in.options());
  if (quant) {
    std::vector<int64_t> sf_shape(lead.begin(), lead.end());
    sf_shape.push_back((h + npc - 1) / npc);
    o.q = at::empty(x_in.sizes(), x_in.options().dtype(at::kFloat8_e4m3fn));
    o.sf = at::empty(sf_shape, x_in.options().dtype(at::kFloat));
  }
  ForwardOutputs flat{o.out.view({-1, h}), o.rstd.view({-1}),
                      residual.has_value() ? o.residual_out.view({-1, h}) : o.residual_out,
                      quant ? o.q.view({-1, h}) : at::Tensor(), quant ? o.sf.view({-1, o.sf.size(-1)}) : at::Tensor()};
  if (acc == at::kDouble) {
    forward_rows<double>(x, residual, weight, eps, out_scale, npc, round_sf, flat);
  } else {
    forward_rows<float>(x, residual, weight, eps, out_scale, npc, round_sf, flat);
  }
  return o;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> rms_norm_cpu(const at::Tensor& x,
                                                            const std::optional<at::Tensor>& weight, double eps,
                                                            const std::optional<at::Tensor>& residual,
                                                            double out_scale) {
  norm::forward_signature(norm::kForward, x, weight, eps, residual, out_scale);
  ForwardOutputs o = forward(x, weight, eps, residual, out_scale, 0, false, false);
  return {o.out, o.rstd, o.residual_out};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> rms_norm_quant_cpu(
    const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
    const std::optional<at::Tensor>& residual, double out_scale, int64_t num_per_channels, bool round_sf) {
  norm::quant_signature(x, weight, eps, residual, out_scale, num_per_channels);
  ForwardOutputs o = forward(x, weight, eps, residual, out_scale, num_per_channels, round_sf, true);
  return {o.q, o.sf, o.out, o.rstd, o.residual_out};
}

// ---- backward ----

template <typename acc_t>
void backward_rows(const at::Tensor& grad, const at::Tensor& x, const std::optional<at::Tensor>& weight,
                   const at::Tensor& rstd, const std::optional<at::Tensor>& residual_grad, double out_scale,
                   at::Tensor& x_grad, acc_t* xg_all) {
  const int64_t h = x.size(1), n = x.size(0);
  std::vector<acc_t> w;
  if (weight.has_value()) {
    const at::Tensor wt = weight->to(c10::CppTypeToScalarType<acc_t>::value).contiguous();
    w.assign(wt.const_data_ptr<acc_t>(), wt.const_data_ptr<acc_t>() + h);
  }
  const acc_t scale = static_cast<acc_t>(out_scale), h_acc = static_cast<acc_t>(h);
  const acc_t* rs = rstd.const_data_ptr<acc_t>();
  for_row_chunks(n, h, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<acc_t> buffer;
    const int64_t m = r1 - r0, count = m * h;
    acc_t* xhat = scratch(buffer, 3 * count + 3 * h);
    acc_t *gw = xhat + count, *xgw = gw + count, *xr = xgw + count, *gr = xr + h, *extra = gr + h;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = (r - r0) * h;
      load(x, r, h, xr);
      load(grad, r, h, gr);
      backward_terms(xr, gr, h, rs[r], scale, w.empty() ? nullptr : w.data(), xhat + o, gw + o, xgw + o,
                     xg_all != nullptr ? xg_all + r * h : nullptr);
    }
    at::Tensor sums = row_sums(xgw, m, h);
    const acc_t* sm = sums.const_data_ptr<acc_t>();
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = (r - r0) * h;
      if (residual_grad.has_value()) load(*residual_grad, r, h, extra);
      input_grad(xhat + o, gw + o, h, sm[r - r0] / h_acc, rs[r], residual_grad.has_value() ? extra : nullptr, xr);
      store(xr, h, x_grad, r);
    }
  });
}

std::tuple<at::Tensor, at::Tensor> rms_norm_backward_cpu(const at::Tensor& out_grad, const at::Tensor& x_in,
                                                         const std::optional<at::Tensor>& weight,
                                                         const at::Tensor& rstd_in,
                                                         const std::optional<at::Tensor>& residual_out_grad,
                                                         double out_scale) {
  norm::backward_signature(out_grad, x_in, weight, rstd_in, residual_out_grad, out_scale);

  const at::ScalarType acc = compute_type(x_in);
  const int64_t h = x_in.size(-1);
  const at::Tensor x = x_in.contiguous().view({-1, h}), grad = out_grad.contiguous().view({-1, h});
  const at::Tensor rstd = rstd_in.contiguous().view({-1});
  std::optional<at::Tensor> residual_grad;
  if (residual_out_grad.has_value()) residual_grad = residual_out_grad->contiguous().view({-1, h});
  at::Tensor x_grad = at::empty(x_in.sizes(), x_in.options());
  at::Tensor x_grad_flat = x_grad.view({-1, h});
  // The weight gradient's terms x^ * g for every row, summed over the rows by ATen at the end (torch's order).
  at::Tensor xg = weight.has_value() ? at::empty({x.size(0), h}, x_in.options().dtype(acc)) : at::Tensor();
  if (acc == at::kDouble) {
    backward_rows<double>(grad, x, weight, rstd, residual_grad, out_scale, x_grad_flat,
                          xg.defined() ? xg.data_ptr<double>() : nullptr);
  } else {
    backward_rows<float>(grad, x, weight, rstd, residual_grad, out_scale, x_grad_flat,
                         xg.defined() ? xg.data_ptr<float>() : nullptr);
  }
  at::Tensor weight_grad = xg.defined() ? xg.sum(0) : at::empty({0}, x_in.options().dtype(acc));
  return {x_grad, weight_grad};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- norm family: s = x (+ residual, rounded to x's dtype); rstd = rsqrt(sum(s^2) / H + eps);
  // out = s * rstd * (weight * out_scale) rounded to x's dtype ----
  m.set_python_module("torch_ascend_moe.fakes.norm");
  // x [..., H] BF16/FP32 (FP64 for gradcheck), weight [H] of x's dtype or None (unit). Computed in FP32 (FP64 for FP64
  // x). -> (out [..., H], rstd FP32 [...], residual_out [..., H] = s (empty without a residual)).
  m.def(
      "rms_norm(Tensor x, Tensor? weight, float eps=1e-6, Tensor? residual=None, float out_scale=1.) "
      "-> (Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // rms_norm fused with the per-token E4M3 cast of its rounded output in blocks of num_per_channels (TileKernels'
  // rule: multiplier 448 / amax, or 1 / sf with round_sf; amax floored at 1e-4): the inference path, not
  // differentiable. -> (out_fp8 [..., H], out_sf FP32 [..., ceil(H / num_per_channels)], out, rstd, residual_out).
  m.def(
      "rms_norm_quant(Tensor x, Tensor? weight, float eps=1e-6, Tensor? residual=None, float out_scale=1., "
      "int num_per_channels=32, bool round_sf=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // The gradient of rms_norm from its saved s (x, or the residual sum) and rstd: with x^ = s * rstd and
  // g = out_grad * out_scale, gw = g * weight: x_grad = (gw - x^ * sum(x^ * gw) / H) * rstd (+ residual_out_grad)
  // in s's dtype; weight_grad = sum over rows of x^ * g (FP32; empty without a weight).
  m.def(
      "rms_norm_backward(Tensor out_grad, Tensor x, Tensor? weight, Tensor rstd, Tensor? residual_out_grad=None, "
      "float out_scale=1.) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("rms_norm_quant", &rms_norm_quant_cpu);
  m.impl("rms_norm_backward", &rms_norm_backward_cpu);
}

}  // namespace ascend_moe
