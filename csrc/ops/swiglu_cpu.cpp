// The swiglu family: the experts' activation between the two grouped GEMMs as TileKernels computes it
// (specs/tilekernels_deepselect.md §6, §10.6): SwiGLU with the clamp and its counters, a routing weight per expanded
// row, DeepGEMM's psum layout, and the per-token FP8 cast of the result (forward) or of the input gradient
// (backward). Schemas, and the CPU kernels: one pass over x per row chunk (load, clamp and count, exp, the SwiGLU
// arithmetic, the weight, the cast), where the device-generic kernel (torch_ascend_moe/backends/portable/swiglu.py)
// makes about fifteen passes over [N, H] tensors.
//
// Both kernels compute the portable kernel's operations in its order, so results are equal bit for bit: every step
// is one IEEE operation in the compute type (FP32, FP64 for FP64 operands; this file is built without FMA
// contraction, and the backward's fused multiply-add is std::fma, one rounding, where the portable kernel emulates
// one), and exp(-a) is ATen's own CPU exp (called on a chunk buffer), so it is the function torch.exp is.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <c10/util/Float8_e4m3fn.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "swiglu_checks.h"
#include "rows.h"
#include "vector_clones.h"

namespace ascend_moe {
namespace {

constexpr double kE4M3AmaxFloor = 1e-4;  // TileKernels' default sf_clamp_min

using swiglu::compute_type;

// The rows some expert owns in the psum layout (expert e owns [align(psum[e-1]), psum[e])), after the layout's
// value check (swiglu::check_layout_values); empty when every row counts (no layout).
std::vector<uint8_t> layout_rows(const std::optional<at::Tensor>& psum, int64_t alignment, int64_t rows) {
  if (!psum.has_value()) return {};
  std::vector<uint8_t> owned(rows, 0);
  const at::Tensor ends = psum->contiguous();
  const int32_t* e = ends.data_ptr<int32_t>();
  int64_t prev = 0;
  for (int64_t i = 0; i < ends.numel(); ++i) {
    const int64_t end = e[i], start = (prev + alignment - 1) / alignment * alignment;
    for (int64_t r = start; r < end; ++r) owned[r] = 1;
    prev = end;
  }
  return owned;
}

// ---- element loops: plain loops over contiguous buffers, built for AVX2 and baseline x86-64 (AM_VECTOR_CLONES) ----
// Every step is one IEEE operation: no expression has the a * b + c shape a compiler could contract into an FMA.

// torch.clamp's results (NaN kept): a = min(a, c), b = clamp(b, -c, c); counts #(a > c), #(b > c), #(b < -c).
template <typename T>
inline void clamp_count_impl(T* a, T* b, int64_t h, T c, int64_t* counts) {
  int64_t na = 0, nhi = 0, nlo = 0;
  for (int64_t j = 0; j < h; ++j) {
    const T x = a[j], y = b[j];
    na += x > c;
    nhi += y > c;
    nlo += y < -c;
    a[j] = x > c ? c : x;
    b[j] = y > c ? c : (y < -c ? -c : y);
  }
  counts[0] += na, counts[1] += nhi, counts[2] += nlo;
}
AM_VECTOR_CLONES void clamp_count(float* a, float* b, int64_t h, float c, int64_t* counts) {
  clamp_count_impl(a, b, h, c, counts);
}
void clamp_count(double* a, double* b, int64_t h, double c, int64_t* counts) { clamp_count_impl(a, b, h, c, counts); }

// The backward's clamp: the same bounds, and which elements the clamp held (their gradient is 0).
template <typename T>
inline void clamp_flags_impl(T* a, T* b, int64_t h, T c, uint8_t* a_held, uint8_t* b_held) {
  for (int64_t j = 0; j < h; ++j) {
    const T x = a[j], y = b[j];
    a_held[j] = x > c;
    b_held[j] = (y > c) | (y < -c);
    a[j] = x > c ? c : x;
    b[j] = y > c ? c : (y < -c ? -c : y);
  }
}
AM_VECTOR_CLONES void clamp_flags(float* a, float* b, int64_t h, float c, uint8_t* a_held, uint8_t* b_held) {
  clamp_flags_impl(a, b, h, c, a_held, b_held);
}
void clamp_flags(double* a, double* b, int64_t h, double c, uint8_t* a_held, uint8_t* b_held) {
  clamp_flags_impl(a, b, h, c, a_held, b_held);
}

template <typename T>
inline void negate_impl(const T* src, int64_t n, T* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = -src[j];
}
AM_VECTOR_CLONES void negate(const float* src, int64_t n, float* dst) { negate_impl(src, n, dst); }
void negate(const double* src, int64_t n, double* dst) { negate_impl(src, n, dst); }

// y = a / (1 + e) * b (e = exp(-a)), times w when weighted.
template <typename T>
inline void swiglu_impl(const T* a, const T* b, const T* e, int64_t h, bool weighted, T w, T* y) {
  for (int64_t j = 0; j < h; ++j) y[j] = a[j] / (T(1) + e[j]) * b[j];
  if (weighted)
    for (int64_t j = 0; j < h; ++j) y[j] = y[j] * w;
}
AM_VECTOR_CLONES void swiglu_row(const float* a, const float* b, const float* e, int64_t h, bool weighted, float w,
                                 float* y) {
  swiglu_impl(a, b, e, h, weighted, w, y);
}
void swiglu_row(const double* a, const double* b, const double* e, int64_t h, bool weighted, double w, double* y) {
  swiglu_impl(a, b, e, h, weighted, w, y);
}

// The backward of one row: s = 1 / (1 + e), gws = g * w * s (g * s unweighted), da = gws * b * fma(a, 1 - s, 1),
// db = gws * a, out = a / (1 + e) * b (* w), gact = g * (a / (1 + e) * b) (the weight gradient's terms).
template <typename T, typename Fma>
inline void backward_impl(const T* a, const T* b, const T* e, const T* g, int64_t h, bool weighted, T w, T* da, T* db,
                          T* out, T* gact, Fma fma) {
  for (int64_t j = 0; j < h; ++j) {
    const T t = T(1) + e[j];
    const T s = T(1) / t;
    const T gws = weighted ? g[j] * w * s : g[j] * s;
    da[j] = gws * b[j] * fma(a[j], T(1) - s, T(1));
    db[j] = gws * a[j];
    const T act = a[j] / t * b[j];
    out[j] = weighted ? act * w : act;
    gact[j] = g[j] * act;
  }
}
// TileKernels' fma rounded once (FP32); the FP64 gradcheck path takes the plain expression, as the portable kernel.
AM_VECTOR_CLONES void backward_row(const float* a, const float* b, const float* e, const float* g, int64_t h,
                                   bool weighted, float w, float* da, float* db, float* out, float* gact) {
  backward_impl(a, b, e, g, h, weighted, w, da, db, out, gact,
                [](float x, float y, float z) { return std::fma(x, y, z); });
}
void backward_row(const double* a, const double* b, const double* e, const double* g, int64_t h, bool weighted,
                  double w, double* da, double* db, double* out, double* gact) {
  backward_impl(a, b, e, g, h, weighted, w, da, db, out, gact, [](double x, double y, double z) {
    const double p = x * y;  // two roundings, on purpose
    return p + z;
  });
}

// Row r of x (columns contiguous) into dst in the compute type: BF16/FP32/FP64 converted, E4M3 codes times their
// FP32 block scale (one FP32 product) and then converted.
template <typename acc_t>
void load_row(const at::Tensor& x, const float* sf_row, int64_t sf_block, int64_t r, int64_t col0, int64_t cols,
              acc_t* dst) {
  const int64_t offset = r * x.stride(0) + col0;
  if (x.scalar_type() != at::kFloat8_e4m3fn) {
    load_values(x.scalar_type(), static_cast<const char*>(x.const_data_ptr()) + offset * x.element_size(), cols, dst);
    return;
  }
  const c10::Float8_e4m3fn* p = x.const_data_ptr<c10::Float8_e4m3fn>() + offset;  // E4M3 with block scales
  for (int64_t j = 0; j < cols; ++j) {
    dst[j] = static_cast<acc_t>(static_cast<float>(p[j]) * sf_row[(col0 + j) / sf_block]);
  }
}

// src [cols] in the compute type into row r of a contiguous output (one rounding, as .to(out's dtype)).
template <typename acc_t>
void store_row(const acc_t* src, int64_t cols, at::Tensor& out, int64_t r) {
  store_values(src, cols, out.scalar_type(), static_cast<char*>(out.data_ptr()) + r * cols * out.element_size());
}

// exp(-a) of a chunk: negated into e, then ATen's CPU exp in place (the function torch.exp is; inside a parallel
// region it runs on this thread).
template <typename acc_t>
void exp_neg(const acc_t* a, int64_t n, acc_t* e) {
  negate(a, n, e);
  at::from_blob(e, {n}, at::TensorOptions().dtype(c10::CppTypeToScalarType<acc_t>::value)).exp_();
}

// The routing weight per row in the compute type: topk_weights times the scaling factor (one rounding; a Python
// float scalar meets a tensor in the tensor's dtype), 0 off the layout. Empty without weights.
template <typename acc_t>
std::vector<acc_t> row_weights(const std::optional<at::Tensor>& w, std::optional<double> scale,
                               const std::vector<uint8_t>& owned, int64_t rows) {
  if (!w.has_value()) return {};
  const at::Tensor wt = w->to(c10::CppTypeToScalarType<acc_t>::value).contiguous();
  const acc_t* p = wt.const_data_ptr<acc_t>();
  std::vector<acc_t> out(rows);
  for (int64_t r = 0; r < rows; ++r) {
    acc_t v = p[r];
    if (scale.has_value()) v = v * static_cast<acc_t>(*scale);
    out[r] = owned.empty() || owned[r] ? v : acc_t(0);
  }
  return out;
}

// ---- forward ----

template <typename acc_t>
void forward_rows(const at::Tensor& x, const std::vector<acc_t>& w, const std::vector<uint8_t>& owned,
                  std::optional<double> clamp, at::Tensor& out, at::Tensor& sf, int64_t npc, bool round_sf,
                  float floor, std::atomic<int64_t>* counts) {
  const int64_t rows = x.size(0), h = x.size(1) / 2;
  const bool fp8 = out.scalar_type() == at::kFloat8_e4m3fn;
  const bool direct = std::is_same_v<acc_t, float> && out.scalar_type() == at::kFloat;
  for_row_chunks(rows, h, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<acc_t> buffer;
    thread_local std::vector<float> buffer32;
    const int64_t n = (r1 - r0) * h;
    acc_t* a = scratch(buffer, 4 * n);
    acc_t *b = a + n, *e = b + n, *y_chunk = e + n;
    float* y32 = fp8 ? scratch(buffer32, h) : nullptr;
    int64_t local[3] = {0, 0, 0};
    for (int64_t r = r0; r < r1; ++r) {
      acc_t* ar = a + (r - r0) * h;
      acc_t* br = b + (r - r0) * h;
      if (!owned.empty() && !owned[r]) {  // the row's output is 0: its buffers only need to be harmless
        std::fill(ar, ar + h, acc_t(0));
        std::fill(br, br + h, acc_t(0));
        continue;
      }
      load_row<acc_t>(x, nullptr, 1, r, 0, h, ar);
      load_row<acc_t>(x, nullptr, 1, r, h, h, br);
      if (clamp.has_value()) clamp_count(ar, br, h, static_cast<acc_t>(*clamp), local);
    }
    exp_neg(a, n, e);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = (r - r0) * h;
      // FP32 out: straight into the output row.
      acc_t* yr = direct ? reinterpret_cast<acc_t*>(out.data_ptr<float>() + r * h) : y_chunk + o;
      if (owned.empty() || owned[r]) {
        swiglu_row(a + o, b + o, e + o, h, !w.empty(), w.empty() ? acc_t(0) : w[r], yr);
      } else {
        std::fill(yr, yr + h, acc_t(0));
      }
      if (!fp8) {
        if (!direct) store_row(yr, h, out, r);
        continue;
      }
      const float* cast_src;
      if constexpr (std::is_same_v<acc_t, float>) {
        cast_src = yr;
      } else {
        for (int64_t j = 0; j < h; ++j) y32[j] = static_cast<float>(yr[j]);
        cast_src = y32;
      }
      const int64_t sf_cols = sf.size(1);
      cast_row_e4m3(cast_src, h, npc, round_sf, floor,
                    reinterpret_cast<uint8_t*>(out.data_ptr<c10::Float8_e4m3fn>()) + r * h,
                    sf.data_ptr<float>() + r * sf_cols);
    }
    for (int i = 0; i < 3; ++i) counts[i] += local[i];
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> swiglu_forward_cpu(
    const at::Tensor& x_in, const std::optional<at::Tensor>& topk_weights,
    const std::optional<at::Tensor>& psum, int64_t alignment, std::optional<double> routed_scaling_factor,
    std::optional<double> clamp_value, std::optional<at::ScalarType> out_dtype, int64_t num_per_channels,
    bool round_sf, std::optional<double> sf_clamp_min) {
  const at::ScalarType out_t = swiglu::forward_signature(x_in, topk_weights, psum, alignment, routed_scaling_factor,
                                                         clamp_value, out_dtype, num_per_channels, sf_clamp_min);
  const int64_t n = x_in.size(0), h = x_in.size(1) / 2;
  swiglu::check_layout_values(swiglu::kForward, psum, alignment, n);
  const at::ScalarType acc = compute_type(x_in);
  const std::vector<uint8_t> owned = layout_rows(psum, alignment, n);

  const bool fp8 = out_t == at::kFloat8_e4m3fn;
  at::Tensor out = at::empty({n, h}, x_in.options().dtype(out_t));
  at::Tensor sf = at::empty(fp8 ? std::vector<int64_t>{n, (h + num_per_channels - 1) / num_per_channels}
                                : std::vector<int64_t>{0},
                            x_in.options().dtype(at::kFloat));
  const at::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  std::atomic<int64_t> counts[3] = {0, 0, 0};
  const float floor = static_cast<float>(sf_clamp_min.value_or(kE4M3AmaxFloor));
  if (acc == at::kDouble) {
    forward_rows<double>(x, row_weights<double>(topk_weights, routed_scaling_factor, owned, n), owned, clamp_value,
                         out, sf, num_per_channels, round_sf, floor, counts);
  } else {
    forward_rows<float>(x, row_weights<float>(topk_weights, routed_scaling_factor, owned, n), owned, clamp_value,
                        out, sf, num_per_channels, round_sf, floor, counts);
  }
  at::Tensor count = at::zeros({4}, x_in.options().dtype(at::kLong));
  if (clamp_value.has_value()) {
    const int64_t valid = owned.empty() ? n : std::count(owned.begin(), owned.end(), uint8_t{1});
    int64_t* c = count.data_ptr<int64_t>();
    c[0] = counts[0], c[1] = counts[1], c[2] = counts[2], c[3] = valid * h;
  }
  return {out, sf, count};
}

// ---- backward ----

struct BackwardOutputs {
  at::Tensor x_grad, q, sf, weight_grad, out;
};

template <typename acc_t>
void backward_rows(const at::Tensor& x, const at::Tensor* x_sf, const at::Tensor& grad,
                   const std::vector<acc_t>& w, std::optional<double> scale, const std::vector<uint8_t>& owned,
                   std::optional<double> clamp, int64_t npc, bool round_sf, BackwardOutputs& o) {
  const int64_t rows = x.size(0), h = x.size(1) / 2;
  const int64_t sf_block = x_sf != nullptr ? x.size(1) / x_sf->size(1) : 1;
  const at::ScalarType acc_type = c10::CppTypeToScalarType<acc_t>::value;
  for_row_chunks(rows, h, [&](int64_t r0, int64_t r1) {
    thread_local std::vector<acc_t> buffer;
    thread_local std::vector<uint8_t> flags;
    thread_local std::vector<float> buffer32;
    const int64_t m = r1 - r0, n = m * h;
    acc_t* a = scratch(buffer, 4 * n + 4 * h);
    acc_t *b = a + n, *e = b + n, *gact = e + n, *g = gact + n, *grad_row = g + h, *out_row = grad_row + 2 * h;
    uint8_t* a_held = clamp ? scratch(flags, 2 * n) : nullptr;
    uint8_t* b_held = clamp ? a_held + n : nullptr;
    float* g32 = npc ? scratch(buffer32, 2 * h) : nullptr;
    for (int64_t r = r0; r < r1; ++r) {
      acc_t* ar = a + (r - r0) * h;
      acc_t* br = b + (r - r0) * h;
      const float* sf_row = x_sf != nullptr ? x_sf->const_data_ptr<float>() + r * x_sf->stride(0) : nullptr;
      load_row<acc_t>(x, sf_row, sf_block, r, 0, h, ar);
      load_row<acc_t>(x, sf_row, sf_block, r, h, h, br);
      if (clamp.has_value()) {
        clamp_flags(ar, br, h, static_cast<acc_t>(*clamp), a_held + (r - r0) * h, b_held + (r - r0) * h);
      }
    }
    exp_neg(a, n, e);
    for (int64_t r = r0; r < r1; ++r) {
      const bool on = owned.empty() || owned[r];
      const int64_t o0 = (r - r0) * h;
      load_row<acc_t>(grad, nullptr, 1, r, 0, h, g);
      acc_t* da = grad_row;
      acc_t* db = grad_row + h;
      backward_row(a + o0, b + o0, e + o0, g, h, !w.empty(), w.empty() ? acc_t(0) : w[r], da, db, out_row,
                   gact + o0);
      if (clamp.has_value()) {
        const uint8_t* ah = a_held + o0;
        const uint8_t* bh = b_held + o0;
        for (int64_t j = 0; j < h; ++j) {
          da[j] = ah[j] ? acc_t(0) : da[j];
          db[j] = bh[j] ? acc_t(0) : db[j];
        }
      }
      if (!on) {
        std::fill(grad_row, grad_row + 2 * h, acc_t(0));
        std::fill(out_row, out_row + h, acc_t(0));
      }
      store_row(grad_row, 2 * h, o.x_grad, r);
      store_row(out_row, h, o.out, r);
      if (npc) {
        const float* cast_src;
        if constexpr (std::is_same_v<acc_t, float>) {
          cast_src = grad_row;
        } else {
          for (int64_t j = 0; j < 2 * h; ++j) g32[j] = static_cast<float>(grad_row[j]);
          cast_src = g32;
        }
        const int64_t sf_cols = o.sf.size(1);
        cast_row_e4m3(cast_src, 2 * h, npc, round_sf, static_cast<float>(kE4M3AmaxFloor),
                      reinterpret_cast<uint8_t*>(o.q.data_ptr<c10::Float8_e4m3fn>()) + r * 2 * h,
                      o.sf.data_ptr<float>() + r * sf_cols);
      }
    }
    if (!w.empty()) {
      // The row sums of grad_out * act by ATen's sum over the rows of the chunk (torch's reduction order).
      at::Tensor sums = at::from_blob(gact, {m, h}, at::TensorOptions().dtype(acc_type)).sum(1);
      const acc_t* s = sums.const_data_ptr<acc_t>();
      acc_t* wg = o.weight_grad.data_ptr<acc_t>();
      for (int64_t r = r0; r < r1; ++r) {
        acc_t v = owned.empty() || owned[r] ? s[r - r0] : acc_t(0);
        if (scale.has_value()) v = v * static_cast<acc_t>(*scale);
        wg[r] = v;
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> swiglu_backward_cpu(
    const at::Tensor& x_in, const std::optional<at::Tensor>& x_sf_in, const at::Tensor& grad_in,
    const std::optional<at::Tensor>& topk_weights, const std::optional<at::Tensor>& psum, int64_t alignment,
    std::optional<double> routed_scaling_factor, std::optional<double> clamp_value,
    std::optional<at::ScalarType> out_dtype, int64_t num_per_channels, bool round_sf) {
  const at::ScalarType out_t = swiglu::backward_signature(x_in, x_sf_in, grad_in, topk_weights, psum, alignment,
                                                          routed_scaling_factor, clamp_value, out_dtype,
                                                          num_per_channels);
  const int64_t n = x_in.size(0), h = x_in.size(1) / 2;
  swiglu::check_layout_values(swiglu::kBackward, psum, alignment, n);
  const std::vector<uint8_t> owned = layout_rows(psum, alignment, n);

  const at::ScalarType acc = compute_type(x_in, &grad_in);
  const int64_t npc = num_per_channels;
  const auto opts = grad_in.options();
  BackwardOutputs o{
      at::empty({n, 2 * h}, opts.dtype(out_t)),
      at::empty(npc ? std::vector<int64_t>{n, 2 * h} : std::vector<int64_t>{0}, opts.dtype(at::kFloat8_e4m3fn)),
      at::empty(npc ? std::vector<int64_t>{n, (2 * h + npc - 1) / npc} : std::vector<int64_t>{0},
                opts.dtype(at::kFloat)),
      at::empty({topk_weights.has_value() ? n : 0}, opts.dtype(acc)),
      at::empty({n, h}, opts.dtype(out_t)),
  };
  const at::Tensor x = x_in.stride(1) == 1 ? x_in : x_in.contiguous();
  const at::Tensor grad = grad_in.stride(1) == 1 ? grad_in : grad_in.contiguous();
  std::optional<at::Tensor> x_sf;
  if (x_sf_in.has_value()) x_sf = x_sf_in->stride(1) == 1 ? *x_sf_in : x_sf_in->contiguous();
  const at::Tensor* sf_ptr = x_sf.has_value() ? &*x_sf : nullptr;
  if (acc == at::kDouble) {
    backward_rows<double>(x, sf_ptr, grad, row_weights<double>(topk_weights, routed_scaling_factor, owned, n),
                          routed_scaling_factor, owned, clamp_value, npc, round_sf, o);
  } else {
    backward_rows<float>(x, sf_ptr, grad, row_weights<float>(topk_weights, routed_scaling_factor, owned, n),
                         routed_scaling_factor, owned, clamp_value, npc, round_sf, o);
  }
  return {o.x_grad, o.q, o.sf, o.weight_grad, o.out};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- swiglu family: clamp (counted) -> silu(a) * b -> x routing weight -> FP32 / BF16 / per-token E4M3 ----
  m.set_python_module("torch_ascend_moe.fakes.swiglu");
  // x [N, 2H] = [a | b]. a = min(a, c), b = clamp(b, -c, c) when clamp_value c is given; y = a / (1 + exp(-a)) * b
  // in FP32 (FP64 for FP64 x); y *= topk_weights[n] * routed_scaling_factor. Rows outside the psum layout
  // (expert e owns [align(psum[e-1], alignment), psum[e])) are 0. out_dtype None: the compute dtype (FP32, FP64
  // for FP64 x); float8_e4m3fn: y cast per row in blocks of num_per_channels (TileKernels' rule: multiplier
  // 448 / amax, or 1 / sf with round_sf; amax floored at sf_clamp_min, default 1e-4), sf FP32
  // [N, ceil(H / num_per_channels)]; other dtypes: sf empty.
  // -> (out [N, H], sf, clamped_count int64 [4]: #(a > c), #(b > c), #(b < -c), valid rows * H).
  m.def(
      "swiglu_forward(Tensor x, Tensor? topk_weights=None, Tensor? psum_num_tokens_per_expert=None, "
      "int alignment=128, float? routed_scaling_factor=None, float? clamp_value=None, "
      "ScalarType? out_dtype=None, int num_per_channels=128, bool round_sf=False, float? sf_clamp_min=None) "
      "-> (Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // The gradient of swiglu_forward (TileKernels' swiglu_backward(_and_per_token_cast)): x [N, 2H] (or E4M3 with
  // FP32 per-row block scales x_sf [N, 2H / block]) and grad_out [N, H]. With w = topk_weights * scale (0 off
  // the layout) and s = 1 / (1 + exp(-a)) on the clamped halves: g = grad_out * w * s, da = g * b * fma(a, 1 - s,
  // 1), db = g * a, zero where the clamp held; out = a / (1 + exp(-a)) * b * w (the recomputed forward);
  // weight_grad[n] = sum_h grad_out * a / (1 + exp(-a)) * b, times scale, 0 off the layout.
  // -> (x_grad [N, 2H] in out_dtype (grad_out's by default), x_grad's per-token E4M3 cast in blocks of
  // num_per_channels and its FP32 sf when num_per_channels > 0 (empty otherwise; cast from the FP32 gradient),
  // weight_grad [N] (empty without weights), out [N, H] in out_dtype).
  m.def(
      "swiglu_backward(Tensor x, Tensor? x_sf, Tensor grad_out, Tensor? topk_weights=None, "
      "Tensor? psum_num_tokens_per_expert=None, int alignment=128, float? routed_scaling_factor=None, "
      "float? clamp_value=None, ScalarType? out_dtype=None, int num_per_channels=0, bool round_sf=False) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("swiglu_forward", &swiglu_forward_cpu);
  m.impl("swiglu_backward", &swiglu_backward_cpu);
}

}  // namespace ascend_moe
