// CPU kernels of the grouped family: MoE grouped GEMMs (m-grouped contiguous, m-grouped masked,
// k-grouped), one C++ loop over expert segments calling the gemm family's worker (`matmul_into`), so no
// per-expert Python sits on the hot path.
//
// Layouts (specs/deepgemm_api.md §4, §6): psum = cumulative group ends [G] (torch._grouped_mm's `offs`),
// group g spans rows [align(end_{g-1}, alignment), end_g); ids = one group id per row [M], -1 = padding.
// Rows outside every group are written as zeros.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "fp8_gemm.h"
#include "gemm.h"
#include "quant.h"

namespace ascend_moe {
namespace {

constexpr const char* kMGrouped = "ascend_moe::m_grouped_bf16_gemm";
constexpr const char* kMasked = "ascend_moe::m_grouped_bf16_gemm_masked";
constexpr const char* kKGrouped = "ascend_moe::k_grouped_bf16_gemm";
constexpr const char* kMGroupedFp8 = "ascend_moe::m_grouped_fp8_gemm";
constexpr const char* kMaskedFp8 = "ascend_moe::m_grouped_fp8_gemm_masked";
constexpr const char* kLinearFp8 = "ascend_moe::m_grouped_fp8_linear";
constexpr const char* kKGroupedFp8 = "ascend_moe::k_grouped_fp8_gemm";

struct Segment {
  int64_t group, begin, end;  // rows [begin, end) belong to `group`
};

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

void check_layout_tensor(const char* op, const at::Tensor& layout, bool psum, int64_t length, const at::Tensor& ref) {
  check_rank(op, "layout", layout, 1, psum ? "[G] (cumulative group ends)" : "[M] (group id per row, -1 = padding)");
  AM_CHECK_ARG(layout.scalar_type() == at::kInt, op, "layout", "dtype", "torch.int32", dtype_name(layout.scalar_type()));
  check_same_device(op, "layout", layout, ref);
  check_dim_size(op, "layout", layout, 0, psum ? "groups" : "rows", length, psum ? "b's groups" : "rows of a");
}

// The rows of each group, validated against the data (eager only: a fake cannot see values).
std::vector<Segment> layout_segments(const char* op, const at::Tensor& layout, bool psum, int64_t alignment,
                                     int64_t rows, int64_t groups) {
  const at::Tensor values = layout.to(at::kCPU, at::kLong).contiguous();
  const int64_t* v = values.const_data_ptr<int64_t>();
  std::vector<Segment> segments;
  if (psum) {
    int64_t prev = 0;
    for (int64_t g = 0; g < values.numel(); ++g) {
      const int64_t start = align_up(prev, alignment);
      AM_CHECK_ARG(v[g] >= start && v[g] <= rows, op, "layout", "values",
                   "cumulative group ends (psum): layout[g] >= align(layout[g-1], alignment=" +
                       std::to_string(alignment) + ") and <= " + std::to_string(rows) + " rows",
                   "layout[" + std::to_string(g) + "] = " + std::to_string(v[g]) + " (group start " +
                       std::to_string(start) + ")");
      segments.push_back({g, start, v[g]});
      prev = v[g];
    }
    return segments;
  }
  for (int64_t i = 0; i < values.numel();) {
    const int64_t g = v[i];
    AM_CHECK_ARG(g >= -1 && g < groups, op, "layout", "values",
                 "group ids in [-1, " + std::to_string(groups) + ") (-1 = padding row)",
                 "layout[" + std::to_string(i) + "] = " + std::to_string(g));
    int64_t j = i + 1;
    while (j < values.numel() && v[j] == g) ++j;
    if (g >= 0) segments.push_back({g, i, j});
    i = j;
  }
  return segments;
}

void check_alignment(const char* op, int64_t alignment) {
  check_int_arg(op, "alignment", alignment, 1);
}

at::Tensor m_grouped_bf16_gemm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout, bool psum,
                                   int64_t alignment, std::optional<at::ScalarType> out_dtype) {
  check_rank(kMGrouped, "a", a, 2, "[M, K]");
  check_rank(kMGrouped, "b", b, 3, "[G, N, K]");
  check_operand_dtypes(kMGrouped, a, b);
  check_same_device(kMGrouped, "b", b, a);
  check_dim_size(kMGrouped, "b", b, 2, "K", a.size(1), "a.size(1)");
  check_alignment(kMGrouped, alignment);
  check_layout_tensor(kMGrouped, layout, psum, psum ? b.size(0) : a.size(0), a);
  const at::ScalarType out_t = resolve_out_dtype(kMGrouped, a, std::nullopt, out_dtype);
  at::Tensor out = at::zeros({a.size(0), b.size(1)}, a.options().dtype(out_t));
  for (const Segment& s : layout_segments(kMGrouped, layout, psum, alignment, a.size(0), b.size(0))) {
    if (s.end == s.begin) continue;
    at::Tensor rows = out.narrow(0, s.begin, s.end - s.begin);
    matmul_into(rows, a.narrow(0, s.begin, s.end - s.begin), b.select(0, s.group), std::nullopt, 1.0);
  }
  return out;
}

void check_masked_m(const char* op, const at::Tensor& masked_m, const at::Tensor& a) {
  check_rank(op, "masked_m", masked_m, 1, "[G]");
  AM_CHECK_ARG(masked_m.scalar_type() == at::kInt, op, "masked_m", "dtype", "torch.int32",
               dtype_name(masked_m.scalar_type()));
  check_same_device(op, "masked_m", masked_m, a);
  check_dim_size(op, "masked_m", masked_m, 0, "groups", a.size(0), "a.size(0)");
}

// masked_m's values, each checked to lie in [0, M_max] (eager only: a fake cannot see values).
std::vector<int64_t> masked_rows(const char* op, const at::Tensor& masked_m, int64_t m_max) {
  const at::Tensor m = masked_m.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> rows(m.const_data_ptr<int64_t>(), m.const_data_ptr<int64_t>() + m.numel());
  for (size_t g = 0; g < rows.size(); ++g) {
    AM_CHECK_ARG(rows[g] >= 0 && rows[g] <= m_max, op, "masked_m", "values", "in [0, M_max=" + std::to_string(m_max) + "]",
                 "masked_m[" + std::to_string(g) + "] = " + std::to_string(rows[g]));
  }
  return rows;
}

at::Tensor m_grouped_bf16_gemm_masked_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& masked_m,
                                          std::optional<at::ScalarType> out_dtype) {
  check_rank(kMasked, "a", a, 3, "[G, M_max, K]");
  check_rank(kMasked, "b", b, 3, "[G, N, K]");
  check_operand_dtypes(kMasked, a, b);
  check_same_device(kMasked, "b", b, a);
  check_dim_size(kMasked, "b", b, 0, "groups", a.size(0), "a.size(0)");
  check_dim_size(kMasked, "b", b, 2, "K", a.size(2), "a.size(2)");
  check_masked_m(kMasked, masked_m, a);
  const at::ScalarType out_t = resolve_out_dtype(kMasked, a, std::nullopt, out_dtype);
  const std::vector<int64_t> mv = masked_rows(kMasked, masked_m, a.size(1));
  // Rows at or beyond masked_m[g] are not computed; they are written as zeros.
  at::Tensor out = at::zeros({a.size(0), a.size(1), b.size(1)}, a.options().dtype(out_t));
  for (int64_t g = 0; g < a.size(0); ++g) {
    if (mv[g] == 0) continue;
    at::Tensor rows = out.select(0, g).narrow(0, 0, mv[g]);
    matmul_into(rows, a.select(0, g).narrow(0, 0, mv[g]), b.select(0, g), std::nullopt, 1.0);
  }
  return out;
}

at::Tensor k_grouped_bf16_gemm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout,
                                   int64_t num_groups, bool psum, int64_t alignment, const std::optional<at::Tensor>& c,
                                   std::optional<at::ScalarType> out_dtype) {
  check_rank(kKGrouped, "a", a, 2, "[S, M] (rows are the grouped reduction axis)");
  check_rank(kKGrouped, "b", b, 2, "[S, N]");
  check_operand_dtypes(kKGrouped, a, b);
  check_same_device(kKGrouped, "b", b, a);
  check_dim_size(kKGrouped, "b", b, 0, "S", a.size(0), "a.size(0)");
  check_alignment(kKGrouped, alignment);
  check_int_arg(kKGrouped, "num_groups", num_groups, 0);
  check_layout_tensor(kKGrouped, layout, psum, psum ? num_groups : a.size(0), a);
  const at::ScalarType out_t = resolve_out_dtype(kKGrouped, a, c, out_dtype);
  const std::array<int64_t, 3> shape{num_groups, a.size(1), b.size(1)};
  check_accumulator(kKGrouped, c, a, shape);
  // One accumulator for all segments of a group: a group split into several runs still rounds once.
  const at::ScalarType acc_t = a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // A contiguous copy of c: the output's layout is the fake's (row-major), whatever c's strides are.
  at::Tensor acc = c.has_value() ? c->to(acc_t, false, /*copy=*/true, at::MemoryFormat::Contiguous)
                                 : at::zeros(shape, a.options().dtype(acc_t));
  for (const Segment& s : layout_segments(kKGrouped, layout, psum, alignment, a.size(0), num_groups)) {
    if (s.end == s.begin) continue;
    at::Tensor acc_g = acc.select(0, s.group);
    const int64_t len = s.end - s.begin;
    matmul_into(acc_g, a.narrow(0, s.begin, len).t(), b.narrow(0, s.begin, len).t(), acc_g, 1.0);
  }
  return acc.scalar_type() == out_t ? acc : acc.to(out_t);
}

// Grouped A scales are per row (gran_mn 1): a block of rows could straddle two experts.
void check_row_scales(const char* op, at::IntArrayRef recipe_a) {
  AM_CHECK_ARG(recipe_a.size() == 2 && recipe_a[0] == 1, op, "recipe_a", "value",
               "[1, gran_k] (per-row A scales: a row block could straddle two experts)", shape_str(recipe_a));
}

// Scaled operands of the grouped FP8 GEMMs; returns the output dtype.
at::ScalarType check_grouped_fp8(const char* op, const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                 const at::Tensor& sfb, at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                                 bool a_batched, std::optional<at::ScalarType> out_dtype) {
  check_row_scales(op, recipe_a);
  check_fp8_operand(op, "a", "sfa", a, sfa, recipe_a, a, a_batched);
  check_rank(op, "b", b, 3, "[G, N, K] (FP8) or [G, N, K/2] (FP4 packed in uint8)");
  if (a_batched) check_dim_size(op, "b", b, 0, "groups", a.size(0), "a.size(0)");
  check_fp8_operand(op, "b", "sfb", b, sfb, recipe_b, a, true);
  check_fp8_pairing(op, a, b);
  return check_scaled_out_dtype(op, std::nullopt, out_dtype, at::kBFloat16);
}

at::Tensor m_grouped_fp8_gemm_cpu(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                  const at::Tensor& sfb, const at::Tensor& layout, bool psum, int64_t alignment,
                                  at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                                  std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType out_t = check_grouped_fp8(kMGroupedFp8, a, sfa, b, sfb, recipe_a, recipe_b, false, out_dtype);
  check_alignment(kMGroupedFp8, alignment);
  check_layout_tensor(kMGroupedFp8, layout, psum, psum ? b.size(0) : a.size(0), a);
  const std::array<int64_t, 2> shape{a.size(0), b.size(1)};
  const auto segments = layout_segments(kMGroupedFp8, layout, psum, alignment, a.size(0), b.size(0));
  return with_fp32_accumulator(shape, out_t, at::Tensor(), a.options(), [&](at::Tensor& acc) {
    for (const Segment& s : segments) {
      if (s.end == s.begin) continue;
      const int64_t len = s.end - s.begin;
      at::Tensor rows = acc.narrow(0, s.begin, len);
      fp8_gemm_accumulate(rows, a.narrow(0, s.begin, len), sfa.narrow(0, s.begin, len), b.select(0, s.group),
                          sfb.select(0, s.group), recipe_a, recipe_b, 1.0);
    }
  });
}

at::Tensor m_grouped_fp8_gemm_masked_cpu(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                         const at::Tensor& sfb, const at::Tensor& masked_m, at::IntArrayRef recipe_a,
                                         at::IntArrayRef recipe_b, std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType out_t = check_grouped_fp8(kMaskedFp8, a, sfa, b, sfb, recipe_a, recipe_b, true, out_dtype);
  check_masked_m(kMaskedFp8, masked_m, a);
  const std::vector<int64_t> mv = masked_rows(kMaskedFp8, masked_m, a.size(1));
  const std::array<int64_t, 3> shape{a.size(0), a.size(1), b.size(1)};
  return with_fp32_accumulator(shape, out_t, at::Tensor(), a.options(), [&](at::Tensor& acc) {
    for (int64_t g = 0; g < a.size(0); ++g) {
      if (mv[g] == 0) continue;
      at::Tensor rows = acc.select(0, g).narrow(0, 0, mv[g]);
      fp8_gemm_accumulate(rows, a.select(0, g).narrow(0, 0, mv[g]), sfa.select(0, g).narrow(0, 0, mv[g]),
                          b.select(0, g), sfb.select(0, g), recipe_a, recipe_b, 1.0);
    }
  });
}

// Training path of FP8 experts: x cast per token (1 x block), each expert's weight in block x block blocks
// (DeepSeek-V3's recipe), then the scaled segments; high-precision inputs, output in x's dtype.
at::Tensor m_grouped_fp8_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& layout, bool psum,
                                    int64_t alignment, int64_t block, bool use_ue8m0, bool fp8_backward) {
  check_rank(kLinearFp8, "x", x, 2, "[M, K]");
  AM_CHECK_ARG(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, kLinearFp8, "x", "dtype",
               "torch.bfloat16 or torch.float32", dtype_name(x.scalar_type()));
  check_rank(kLinearFp8, "weight", weight, 3, "[G, N, K]");
  AM_CHECK_ARG(weight.scalar_type() == x.scalar_type(), kLinearFp8, "weight", "dtype",
               dtype_name(x.scalar_type()) + " (same as 'x')", dtype_name(weight.scalar_type()));
  check_same_device(kLinearFp8, "weight", weight, x);
  check_dim_size(kLinearFp8, "weight", weight, 2, "K", x.size(1), "x.size(1)");
  check_int_arg(kLinearFp8, "block", block, 1);
  AM_CHECK_ARG(x.size(1) % block == 0, kLinearFp8, "x", "size(1) (K)", "a multiple of block=" + std::to_string(block),
               x.size(1));
  check_alignment(kLinearFp8, alignment);
  check_layout_tensor(kLinearFp8, layout, psum, psum ? weight.size(0) : x.size(0), x);
  const auto segments = layout_segments(kLinearFp8, layout, psum, alignment, x.size(0), weight.size(0));
  const std::array<int64_t, 2> shape{x.size(0), weight.size(1)};
  return with_fp32_accumulator(shape, x.scalar_type(), at::Tensor(), x.options(), [&](at::Tensor& acc) {
    const auto [xq, xs] = quantize_blocks(x, 1, block, use_ue8m0);
    const std::array<int64_t, 2> recipe_x{1, block}, recipe_w{block, block};
    std::vector<std::pair<at::Tensor, at::Tensor>> experts(weight.size(0));
    for (const Segment& s : segments) {
      if (s.end == s.begin) continue;
      auto& w = experts[s.group];
      if (!w.first.defined()) w = quantize_blocks(weight.select(0, s.group), block, block, use_ue8m0);
      const int64_t len = s.end - s.begin;
      at::Tensor rows = acc.narrow(0, s.begin, len);
      fp8_gemm_accumulate(rows, xq.narrow(0, s.begin, len), xs.narrow(0, s.begin, len), w.first, w.second, recipe_x,
                          recipe_w, 1.0);
    }
  });
}

// FP32 [len, MN] = x[rows] * sf[scale rows] with one scale row per gran_k rows of the group (the group's
// own K blocks: the last may be partial).
at::Tensor dequantize_k_block(const at::Tensor& x, const at::Tensor& sf, int64_t begin, int64_t len, int64_t sf_row,
                              int64_t gran_k) {
  const int64_t blocks = (len + gran_k - 1) / gran_k;
  const at::Tensor scales = sf.narrow(0, sf_row, blocks).to(at::kFloat).repeat_interleave(gran_k, 0).narrow(0, 0, len);
  return x.narrow(0, begin, len).to(at::kFloat).mul_(scales);
}

// Weight gradients in FP8: D[g] = C[g] + deq(A)[rows_g]^T deq(B)[rows_g], A [S, M] and B [S, N] FP8 with
// per-channel scales along the grouped axis: each group's ceil(k_g / gran_k) scale rows follow each other.
at::Tensor k_grouped_fp8_gemm_cpu(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                  const at::Tensor& sfb, const at::Tensor& layout, int64_t num_groups,
                                  int64_t alignment, int64_t gran_k, const std::optional<at::Tensor>& c,
                                  std::optional<at::ScalarType> out_dtype) {
  for (const auto& [name, sf_name, x, sf] : {std::tuple{"a", "sfa", &a, &sfa}, std::tuple{"b", "sfb", &b, &sfb}}) {
    check_rank(kKGroupedFp8, name, *x, 2, "[S, MN] (rows are the grouped reduction axis)");
    AM_CHECK_ARG(x->scalar_type() == at::kFloat8_e4m3fn, kKGroupedFp8, name, "dtype", "torch.float8_e4m3fn",
                 dtype_name(x->scalar_type()));
    check_same_device(kKGroupedFp8, name, *x, a);
    check_rank(kKGroupedFp8, sf_name, *sf, 2, "[sum_g ceil(k_g / gran_k), MN]");
    AM_CHECK_ARG(sf->scalar_type() == at::kFloat || sf->scalar_type() == at::kFloat8_e8m0fnu, kKGroupedFp8, sf_name,
                 "dtype", "torch.float32 or torch.float8_e8m0fnu", dtype_name(sf->scalar_type()));
    check_same_device(kKGroupedFp8, sf_name, *sf, a);
    check_dim_size(kKGroupedFp8, sf_name, *sf, 1, "MN", x->size(1), std::string(name) + ".size(1)");
  }
  check_dim_size(kKGroupedFp8, "b", b, 0, "S", a.size(0), "a.size(0)");
  check_int_arg(kKGroupedFp8, "gran_k", gran_k, 1);
  check_alignment(kKGroupedFp8, alignment);
  check_int_arg(kKGroupedFp8, "num_groups", num_groups, 0);
  check_layout_tensor(kKGroupedFp8, layout, true, num_groups, a);
  const at::ScalarType out_t = check_scaled_out_dtype(kKGroupedFp8, c, out_dtype, at::kFloat);
  const std::array<int64_t, 3> shape{num_groups, a.size(1), b.size(1)};
  check_accumulator(kKGroupedFp8, c, a, shape);
  const auto segments = layout_segments(kKGroupedFp8, layout, true, alignment, a.size(0), num_groups);
  int64_t scale_rows = 0;
  for (const Segment& s : segments) scale_rows += (s.end - s.begin + gran_k - 1) / gran_k;
  for (const auto& [sf_name, sf] : {std::pair{"sfa", &sfa}, std::pair{"sfb", &sfb}}) {
    AM_CHECK_ARG(sf->size(0) == scale_rows, kKGroupedFp8, sf_name, "size(0)",
                 std::to_string(scale_rows) + " (sum over groups of ceil(k_g / gran_k))", sf->size(0));
  }
  return with_fp32_accumulator(shape, out_t, c.value_or(at::Tensor()), a.options(), [&](at::Tensor& acc) {
    int64_t sf_row = 0;
    for (const Segment& s : segments) {
      const int64_t len = s.end - s.begin;
      if (len == 0) continue;
      const at::Tensor a_deq = dequantize_k_block(a, sfa, s.begin, len, sf_row, gran_k);
      const at::Tensor b_deq = dequantize_k_block(b, sfb, s.begin, len, sf_row, gran_k);
      acc.select(0, s.group).addmm_(a_deq.t(), b_deq);
      sf_row += (len + gran_k - 1) / gran_k;
    }
  });
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- grouped family: MoE grouped GEMMs over expert segments (specs/deepgemm_api.md §4-6) ----
  // layout: psum=True -> int32 [G] cumulative group ends (torch._grouped_mm's offs), group g spans rows
  // [align(end_{g-1}, alignment), end_g); psum=False -> int32 [rows] group id per row, -1 = padding.
  // Rows outside every group are zeros in the output.
  m.set_python_module("torch_ascend_moe.meta.grouped");
  // D[i] = A[i] @ B[group(i)]^T: A [M, K], B [G, N, K] (any majorness) -> D [M, N].
  m.def(
      "m_grouped_bf16_gemm(Tensor a, Tensor b, Tensor layout, bool psum=True, int alignment=1, "
      "ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // D[g, i] = A[g, i] @ B[g]^T for i < masked_m[g]; rows at or beyond masked_m[g] are zeros.
  m.def(
      "m_grouped_bf16_gemm_masked(Tensor a, Tensor b, Tensor masked_m, ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // D[g] = C[g] + sum over rows s of group g of A[s]^T B[s]: A [S, M], B [S, N] -> D [G, M, N] (weight grads).
  m.def(
      "k_grouped_bf16_gemm(Tensor a, Tensor b, Tensor layout, int num_groups, bool psum=True, int alignment=1, "
      "Tensor? c=None, ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // Scaled variants (operands and scales as in fp8_gemm; A scales per row, recipe_a = [1, gran_k]).
  m.def(
      "m_grouped_fp8_gemm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor layout, bool psum=True, "
      "int alignment=1, int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "m_grouped_fp8_gemm_masked(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor masked_m, "
      "int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // FP8 experts for training: BF16/FP32 x [M, K] and weight [G, N, K] cast inside (x 1 x block per token,
  // weights block x block), straight-through gradients; fp8_backward picks an FP8 or input-precision dgrad.
  m.def(
      "m_grouped_fp8_linear(Tensor x, Tensor weight, Tensor layout, bool psum=True, int alignment=1, int block=128, "
      "bool use_ue8m0=False, bool fp8_backward=True) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // FP8 weight gradients: D[g] = C[g] + deq(A)[rows_g]^T deq(B)[rows_g] over a psum layout; A [S, M] and
  // B [S, N] FP8 with per-channel scales along S, each group's ceil(k_g / gran_k) scale rows in turn.
  m.def(
      "k_grouped_fp8_gemm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor layout, int num_groups, int alignment=1, "
      "int gran_k=128, Tensor? c=None, ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("m_grouped_bf16_gemm", &m_grouped_bf16_gemm_cpu);
  m.impl("m_grouped_bf16_gemm_masked", &m_grouped_bf16_gemm_masked_cpu);
  m.impl("k_grouped_bf16_gemm", &k_grouped_bf16_gemm_cpu);
  m.impl("m_grouped_fp8_gemm", &m_grouped_fp8_gemm_cpu);
  m.impl("m_grouped_fp8_gemm_masked", &m_grouped_fp8_gemm_masked_cpu);
  m.impl("m_grouped_fp8_linear", &m_grouped_fp8_linear_cpu);
  m.impl("k_grouped_fp8_gemm", &k_grouped_fp8_gemm_cpu);
}

}  // namespace ascend_moe
