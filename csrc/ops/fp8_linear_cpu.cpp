// CPU kernels of the fp8_linear family: quantize high-precision inputs to FP8 E4M3 the way
// deep_gemm.utils' casts do (bit for bit), then run the fp8_gemm family's scaled GEMM on them. The
// quantized copies are transient; the caller keeps its BF16/FP32 tensors (the training master weights).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "checks.h"
#include "fp8_gemm.h"
#include "fp8_linear.h"

namespace ascend_moe {
namespace {

constexpr const char* kQuantGemm = "ascend_moe::fp8_quant_gemm";
constexpr const char* kLinear = "ascend_moe::fp8_linear";
constexpr double kFp8Max = 448.0;
constexpr double kAmaxFloor = 1e-4;

// The smallest power of two >= sf (exponent clamped to [1, 254]): a UE8M0-representable scale. A NaN
// scale (a block holding NaN) stays NaN (UE8M0 code 0xFF), as in quant.ceil_to_ue8m0.
at::Tensor ceil_to_ue8m0(const at::Tensor& sf) {
  const at::Tensor bits = sf.view(at::kInt);
  const at::Tensor exponent =
      bits.bitwise_right_shift(23).bitwise_and(0xFF) + bits.bitwise_and(0x7FFFFF).ne(0).to(at::kInt);
  return at::where(sf.isnan(), sf, exponent.clamp(1, 254).bitwise_left_shift(23).view(at::kFloat));
}

// Per-block amax of a row-major [R, C] matrix in gr x gc blocks, into amax [ceil(R/gr), ceil(C/gc)]
// (blocks past the edge cover only the rows/columns that exist, as zero padding would).
template <typename T>
void block_amax(const T* x, int64_t R, int64_t C, int64_t gr, int64_t gc, float* amax) {
  const int64_t rb = (R + gr - 1) / gr, cb = (C + gc - 1) / gc;
  at::parallel_for(0, rb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* out = amax + b * cb;
      std::fill(out, out + cb, 0.f);
      for (int64_t r = b * gr; r < std::min(R, (b + 1) * gr); ++r) {
        const T* row = x + r * C;
        for (int64_t j = 0; j < cb; ++j) {
          const int64_t c0 = j * gc, c1 = std::min(C, c0 + gc);
          float m = out[j];
          int nan = static_cast<int>(m != m);  // a NaN from an earlier row of the block
          // std::max (and the max reduction) drop a NaN operand; counting NaNs apart keeps the loop a
          // vector max and makes a block holding NaN get a NaN amax (so scale), as torch.amax in the
          // reference cast does.
#pragma omp simd reduction(max : m) reduction(| : nan)
          for (int64_t c = c0; c < c1; ++c) {
            const float v = std::abs(static_cast<float>(row[c]));
            m = std::max(m, v);
            nan |= static_cast<int>(v != v);
          }
          out[j] = nan ? std::numeric_limits<float>::quiet_NaN() : m;
        }
      }
    }
  });
}

// q[r, c] = e4m3(x[r, c] * inv[r / gr, c / gc]), through c10's conversion (the one .to() uses).
template <typename T>
void scale_to_e4m3(const T* x, int64_t R, int64_t C, int64_t gr, int64_t gc, const float* inv, c10::Float8_e4m3fn* q) {
  const int64_t cb = (C + gc - 1) / gc;
  at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const float* inv_row = inv + (r / gr) * cb;
      for (int64_t j = 0; j < cb; ++j) {
        const float f = inv_row[j];
        for (int64_t c = j * gc; c < std::min(C, (j + 1) * gc); ++c) {
          q[r * C + c] = c10::Float8_e4m3fn(static_cast<float>(x[r * C + c]) * f);
        }
      }
    }
  });
}

}  // namespace

// (E4M3 [R, C], FP32 scales [ceil(R / gr), ceil(C / gc)]) of x in gr x gc blocks, bit-identical to the
// Python reference casts (quant.block_cast_to_fp8): amax per block floored at 1e-4 and divided by 448,
// optionally rounded up to a power of two, x multiplied by the scale's reciprocal. Two fused passes over
// x; the scale arithmetic runs as the same ATen ops as the reference, on the small scale tensor.
std::pair<at::Tensor, at::Tensor> quantize_blocks(const at::Tensor& x_in, int64_t gr, int64_t gc, bool ue8m0) {
  const at::Tensor x = x_in.contiguous();
  const int64_t R = x.size(0), C = x.size(1);
  const int64_t rb = (R + gr - 1) / gr, cb = (C + gc - 1) / gc;
  at::Tensor amax = at::empty({rb, cb}, x.options().dtype(at::kFloat));
  at::Tensor q = at::empty({R, C}, x.options().dtype(at::kFloat8_e4m3fn));
  AT_DISPATCH_SWITCH(x.scalar_type(), "quantize_blocks", AT_DISPATCH_CASE(at::kFloat, [&] {
    block_amax(x.const_data_ptr<scalar_t>(), R, C, gr, gc, amax.data_ptr<float>());
  }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
    block_amax(x.const_data_ptr<scalar_t>(), R, C, gr, gc, amax.data_ptr<float>());
  }));
  at::Tensor sf = amax.clamp_min(kAmaxFloor).div(kFp8Max);
  if (ue8m0) sf = ceil_to_ue8m0(sf);
  const at::Tensor inv = sf.reciprocal().mul(1.0);  // the reference multiplies by (1.0 / sf)
  AT_DISPATCH_SWITCH(x.scalar_type(), "quantize_blocks", AT_DISPATCH_CASE(at::kFloat, [&] {
    scale_to_e4m3(x.const_data_ptr<scalar_t>(), R, C, gr, gc, inv.const_data_ptr<float>(),
                  q.data_ptr<c10::Float8_e4m3fn>());
  }) AT_DISPATCH_CASE(at::kBFloat16, [&] {
    scale_to_e4m3(x.const_data_ptr<scalar_t>(), R, C, gr, gc, inv.const_data_ptr<float>(),
                  q.data_ptr<c10::Float8_e4m3fn>());
  }));
  return {q, sf};
}

namespace {

void check_high_precision(const char* op, const char* name, const at::Tensor& x, const char* layout) {
  check_rank(op, name, x, 2, layout);
  AM_CHECK_ARG(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, op, name, "dtype",
               "torch.bfloat16 or torch.float32", dtype_name(x.scalar_type()));
}

void check_block(const char* op, const char* arg, int64_t block, const at::Tensor& x) {
  check_int_arg(op, arg, block, 1);
  AM_CHECK_ARG(x.size(1) % block == 0, op, "x", "size(1) (K)", std::string("a multiple of ") + arg + "=" + std::to_string(block),
               x.size(1));
}

at::Tensor fp8_quant_gemm_cpu(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                              const std::optional<at::Tensor>& c, int64_t gran_k, at::IntArrayRef recipe_b,
                              bool use_ue8m0, double alpha, std::optional<at::ScalarType> out_dtype) {
  check_high_precision(kQuantGemm, "x", x, "[M, K]");
  check_block(kQuantGemm, "gran_k", gran_k, x);
  check_fp8_operand(kQuantGemm, "b", "sfb", b, sfb, recipe_b, x, false);
  AM_CHECK_ARG(logical_k(b) == x.size(1), kQuantGemm, "b", "K", std::to_string(x.size(1)) + " (x's K)",
               logical_k(b));
  const at::ScalarType out_t = check_scaled_out_dtype(kQuantGemm, c, out_dtype, x.scalar_type());
  const std::array<int64_t, 2> shape{x.size(0), b.size(0)};
  check_accumulator(kQuantGemm, c, x, shape);
  return with_fp32_accumulator(shape, out_t, c.value_or(at::Tensor()), x.options(), [&](at::Tensor& acc) {
    const auto [q, sf] = quantize_blocks(x, 1, gran_k, use_ue8m0);
    const std::array<int64_t, 2> recipe_a{1, gran_k};
    fp8_gemm_accumulate(acc, q, sf, b, sfb, recipe_a, recipe_b, alpha);
  });
}

at::Tensor fp8_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                          int64_t block, bool use_ue8m0, bool fp8_backward) {
  check_high_precision(kLinear, "x", x, "[M, K]");
  check_rank(kLinear, "weight", weight, 2, "[N, K]");
  AM_CHECK_ARG(weight.scalar_type() == x.scalar_type(), kLinear, "weight", "dtype",
               dtype_name(x.scalar_type()) + " (same as 'x')", dtype_name(weight.scalar_type()));
  AM_CHECK_ARG(weight.device() == x.device(), kLinear, "weight", "device", x.device().str() + " (same as 'x')",
               weight.device().str());
  check_dim_size(kLinear, "weight", weight, 1, "K", x.size(1), "x.size(1)");
  check_block(kLinear, "block", block, x);
  const int64_t M = x.size(0), N = weight.size(0);
  if (bias.has_value()) {
    AM_CHECK_ARG(bias->dim() == 1 && bias->size(0) == N, kLinear, "bias", "shape",
                 "[" + std::to_string(N) + "] (weight.size(0))", shape_str(bias->sizes()));
    AM_CHECK_ARG(bias->scalar_type() == x.scalar_type(), kLinear, "bias", "dtype",
                 dtype_name(x.scalar_type()) + " (same as 'x')", dtype_name(bias->scalar_type()));
    AM_CHECK_ARG(bias->device() == x.device(), kLinear, "bias", "device", x.device().str() + " (same as 'x')",
                 bias->device().str());
  }
  const std::array<int64_t, 2> shape{M, N};
  return with_fp32_accumulator(shape, x.scalar_type(), bias.value_or(at::Tensor()), x.options(),
                               [&](at::Tensor& acc) {
                                 // DeepSeek-V3's recipe: activations 1 x block per token, weights block x block.
                                 const auto [xq, xs] = quantize_blocks(x, 1, block, use_ue8m0);
                                 const auto [wq, ws] = quantize_blocks(weight, block, block, use_ue8m0);
                                 const std::array<int64_t, 2> recipe_x{1, block}, recipe_w{block, block};
                                 fp8_gemm_accumulate(acc, xq, xs, wq, ws, recipe_x, recipe_w, 1.0);
                               });
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- fp8_linear family: high-precision inputs quantized to FP8 inside the op, then fp8_gemm ----
  // Differentiable w.r.t. the high-precision inputs (straight-through estimator for the casts).
  m.set_python_module("torch_ascend_moe.meta.fp8_linear");
  // Inference: x [M, K] (BF16/FP32) cast per token in 1 x gran_k groups; b pre-quantized as in fp8_gemm.
  m.def(
      "fp8_quant_gemm(Tensor x, Tensor b, Tensor sfb, Tensor? c=None, int gran_k=128, "
      "int[2] recipe_b=[128, 128], bool use_ue8m0=False, float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Training: y = x @ weight^T + bias with x 1 x block per token and weight block x block (DeepSeek-V3);
  // fp8_backward picks FP8 (requantized gradients) or high-precision dgrad/wgrad GEMMs.
  m.def(
      "fp8_linear(Tensor x, Tensor weight, Tensor? bias=None, int block=128, bool use_ue8m0=False, "
      "bool fp8_backward=True) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("fp8_quant_gemm", &fp8_quant_gemm_cpu);
  m.impl("fp8_linear", &fp8_linear_cpu);
}

}  // namespace ascend_moe
