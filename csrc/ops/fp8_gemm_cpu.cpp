// CPU kernel of the fp8_gemm family: block-scaled FP8/FP4 GEMM.
//
// B (the weight, usually the larger operand) is dequantized panel by panel into FP32 and multiplied with
// MKL's SGEMM; A is dequantized once when small, else per row panel too. No full FP32 copy of a large
// operand is made, and the product accumulates in FP32 with one final rounding.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <string>

#include "checks.h"

namespace ascend_moe {
namespace {

constexpr const char* kOp = "ascend_moe::fp8_gemm";
constexpr int64_t kPanelElements = int64_t{1} << 20;    // FP32 elements of a dequantized panel
constexpr int64_t kWholeAElements = int64_t{1} << 22;   // dequantize A at once below this size

bool is_fp4(const at::Tensor& t) { return t.scalar_type() == at::kByte; }

// Logical K of an operand: FP4 stores two values per byte along K.
int64_t logical_k(const at::Tensor& t) { return is_fp4(t) ? 2 * t.size(1) : t.size(1); }

std::string recipe_str(at::IntArrayRef r) { return shape_str(r); }

void check_operand(const char* name, const char* sf_name, const at::Tensor& x, const at::Tensor& sf,
                   at::IntArrayRef recipe, const at::Tensor& ref) {
  check_rank(kOp, name, x, 2, "[MN, K] (FP8) or [MN, K/2] (FP4 packed in uint8)");
  AM_CHECK_ARG(x.scalar_type() == at::kFloat8_e4m3fn || x.scalar_type() == at::kByte, kOp, name, "dtype",
               "torch.float8_e4m3fn, or torch.uint8 (packed FP4)", dtype_name(x.scalar_type()));
  if (is_fp4(x)) {
    AM_CHECK_ARG(x.stride(1) == 1, kOp, name, "stride(1)", "1 (packed FP4 is K-major)", x.stride(1));
  }
  check_same_device(kOp, name, x, ref);
  check_same_device(kOp, sf_name, sf, ref);
  const std::string recipe_name = std::string("recipe_") + name;
  AM_CHECK_ARG(recipe.size() == 2 && recipe[0] > 0 && recipe[1] > 0, kOp, recipe_name.c_str(), "value",
               "[gran_mn, gran_k] with positive entries", recipe_str(recipe));
  const int64_t mn = x.size(0), k = logical_k(x), gmn = recipe[0], gk = recipe[1];
  AM_CHECK_ARG(k % gk == 0, kOp, name, "K", "a multiple of gran_k=" + std::to_string(gk), k);
  AM_CHECK_ARG(sf.scalar_type() == at::kFloat || sf.scalar_type() == at::kFloat8_e8m0fnu, kOp, sf_name, "dtype",
               "torch.float32 or torch.float8_e8m0fnu (unpack int32/int16 UE8M0 first)",
               dtype_name(sf.scalar_type()));
  const std::vector<int64_t> sf_shape{(mn + gmn - 1) / gmn, k / gk};
  AM_CHECK_ARG(sf.sizes() == at::IntArrayRef(sf_shape), kOp, sf_name, "shape",
               shape_str(sf_shape) + " (ceil(MN / gran_mn), K / gran_k)", shape_str(sf.sizes()));
}

// Byte -> FP32 tables: FP8 E4M3 (all 256 codes) and a byte of two E2M1 codes (low nibble first).
// Table lookups beat ATen's generic Float8 conversion by an order of magnitude on CPU.
const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = static_cast<float>(c10::Float8_e4m3fn(static_cast<uint8_t>(i), c10::Float8_e4m3fn::from_bits()));
    return t;
  }();
  return table;
}

constexpr std::array<float, 16> kE2M1{0.f,  0.5f,  1.f,  1.5f,  2.f,  3.f,  4.f,  6.f,
                                      -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

// FP32 [rows, K] = deq(x[r0 : r0 + rows]).
at::Tensor dequantize_rows(const at::Tensor& x, const at::Tensor& sf, int64_t gmn, int64_t gk, int64_t r0,
                           int64_t rows) {
  const int64_t K = logical_k(x);
  // Row-major bytes of the panel (a byte-level transpose for MN-major FP8, which is cheap).
  const at::Tensor bytes = x.narrow(0, r0, rows).view(at::kByte).contiguous();
  at::Tensor out = at::empty({rows, K}, x.options().dtype(at::kFloat));
  const uint8_t* src = bytes.const_data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const bool fp4 = is_fp4(x);
  const float* lut = e4m3_table().data();
  at::parallel_for(0, rows, 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      if (fp4) {
        const uint8_t* row = src + i * (K / 2);
        for (int64_t j = 0; j < K / 2; ++j) {
          dst[i * K + 2 * j] = kE2M1[row[j] & 0xF];
          dst[i * K + 2 * j + 1] = kE2M1[row[j] >> 4];
        }
      } else {
        const uint8_t* row = src + i * K;
        for (int64_t j = 0; j < K; ++j) dst[i * K + j] = lut[row[j]];
      }
    }
  });
  // Scale rows r0..r0+rows-1 use scale rows (r0 + i) / gmn: gather them, then broadcast over each K block.
  const at::Tensor idx = at::arange(r0, r0 + rows, x.options().dtype(at::kLong)).div_(gmn, "floor");
  const at::Tensor scales = sf.to(at::kFloat).index_select(0, idx);  // [rows, K / gk]
  out.view({rows, K / gk, gk}).mul_(scales.unsqueeze(-1));
  return out;
}

at::Tensor fp8_gemm_cpu(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                        const std::optional<at::Tensor>& c, at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                        double alpha, std::optional<at::ScalarType> out_dtype) {
  check_operand("a", "sfa", a, sfa, recipe_a, a);
  check_operand("b", "sfb", b, sfb, recipe_b, a);
  AM_CHECK_ARG(!(is_fp4(a) && !is_fp4(b)), kOp, "a", "dtype",
               "FP8 when b is FP8 (FP4 x FP8 is unsupported, as upstream)", "torch.uint8 (packed FP4)");
  AM_CHECK_ARG(logical_k(b) == logical_k(a), kOp, "b", "K", std::to_string(logical_k(a)) + " (a's K)",
               logical_k(b));
  if (out_dtype.has_value()) {
    AM_CHECK_ARG(*out_dtype == at::kBFloat16 || *out_dtype == at::kFloat, kOp, "out_dtype", "value",
                 "torch.bfloat16 or torch.float32", dtype_name(*out_dtype));
  }
  const at::ScalarType out_t = out_dtype.value_or(c.has_value() ? c->scalar_type() : at::kBFloat16);
  if (c.has_value()) {
    AM_CHECK_ARG(c->scalar_type() == out_t, kOp, "c", "dtype", dtype_name(out_t) + " (out_dtype)",
                 dtype_name(c->scalar_type()));
  }
  const int64_t M = a.size(0), N = b.size(0), K = logical_k(a);
  const std::array<int64_t, 2> shape{M, N};
  check_accumulator(kOp, c, a, shape);

  at::Tensor out = at::empty(shape, a.options().dtype(out_t));
  if (M == 0 || N == 0) return out;
  at::Tensor acc = out_t == at::kFloat ? out : at::empty(shape, a.options().dtype(at::kFloat));
  if (c.has_value()) {
    acc.copy_(*c);
  } else {
    acc.zero_();
  }
  if (K > 0) {
    const bool whole_a = M * K <= kWholeAElements;
    const int64_t a_rows = whole_a ? M : std::max<int64_t>(64, kPanelElements / K);
    const at::Tensor a_whole = whole_a ? dequantize_rows(a, sfa, recipe_a[0], recipe_a[1], 0, M) : at::Tensor();
    const int64_t b_rows = std::clamp<int64_t>(kPanelElements / K / 16 * 16, 16, N);
    for (int64_t n0 = 0; n0 < N; n0 += b_rows) {
      const int64_t nr = std::min(b_rows, N - n0);
      const at::Tensor b_panel = dequantize_rows(b, sfb, recipe_b[0], recipe_b[1], n0, nr);
      for (int64_t m0 = 0; m0 < M; m0 += a_rows) {
        const int64_t mr = std::min(a_rows, M - m0);
        const at::Tensor a_panel = whole_a ? a_whole : dequantize_rows(a, sfa, recipe_a[0], recipe_a[1], m0, mr);
        at::Tensor acc_block = acc.narrow(0, m0, mr).narrow(1, n0, nr);
        at::addmm_out(acc_block, acc_block, a_panel, b_panel.t(), 1.0, alpha);
      }
    }
  }
  if (!acc.is_same(out)) out.copy_(acc);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) { m.impl("fp8_gemm", &fp8_gemm_cpu); }

}  // namespace ascend_moe
