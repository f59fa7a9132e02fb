// CPU kernels of the grouped family: MoE grouped GEMMs (m-grouped contiguous, m-grouped masked,
// k-grouped), one C++ loop over expert segments calling the gemm family's worker (`matmul_into`), so no
// per-expert Python sits on the hot path.
//
// Layouts (specs/deepgemm_api.md §4, §6): psum = cumulative group ends [G] (torch._grouped_mm's `offs`),
// group g spans rows [align(end_{g-1}, alignment), end_g); ids = one group id per row [M], -1 = padding.
// Rows outside every group are written as zeros.
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "fp8_gemm.h"
#include "fp8_linear_checks.h"
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
constexpr const char* kQuantFp8 = "ascend_moe::m_grouped_fp8_quant_gemm";
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

// An m-grouped GEMM's operands: tokens a [M, K], expert weights b [G, N, K] of a's dtype and device.
void check_m_operands(const char* op, const at::Tensor& a, const at::Tensor& b, const char* b_layout) {
  check_rank(op, "a", a, 2, "[M, K]");
  check_rank(op, "b", b, 3, b_layout);
  check_operand_dtypes(op, a, b);
  check_same_device(op, "b", b, a);
  check_dim_size(op, "b", b, 2, "K", a.size(1), "a.size(1)");
}

// Zeroes the rows of out no segment owns (the GEMMs write every other row): runs between and after segments.
void zero_unowned_rows(at::Tensor& out, const std::vector<Segment>& segments) {
  const int64_t M = out.size(0);
  std::vector<char> owned(M, 0);
  for (const Segment& s : segments) std::fill(owned.begin() + s.begin, owned.begin() + s.end, 1);
  for (int64_t r = 0; r < M;) {
    if (owned[r]) {
      ++r;
      continue;
    }
    int64_t e = r;
    while (e < M && !owned[e]) ++e;
    out.narrow(0, r, e - r).zero_();
    r = e;
  }
}

at::Tensor m_grouped_bf16_gemm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout, bool psum,
                                   int64_t alignment, std::optional<at::ScalarType> out_dtype) {
  check_m_operands(kMGrouped, a, b, "[G, N, K]");
  check_alignment(kMGrouped, alignment);
  check_layout_tensor(kMGrouped, layout, psum, psum ? b.size(0) : a.size(0), a);
  const at::ScalarType out_t = resolve_out_dtype(kMGrouped, a, std::nullopt, out_dtype);
  at::Tensor out = at::empty({a.size(0), b.size(1)}, a.options().dtype(out_t));
  const std::vector<Segment> segments = layout_segments(kMGrouped, layout, psum, alignment, a.size(0), b.size(0));
  zero_unowned_rows(out, segments);
  for (const Segment& s : segments) {
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
  // Rows at or beyond masked_m[g] are not computed; they are written as zeros (only they are zeroed).
  at::Tensor out = at::empty({a.size(0), a.size(1), b.size(1)}, a.options().dtype(out_t));
  for (int64_t g = 0; g < a.size(0); ++g) {
    if (mv[g] < a.size(1)) out.select(0, g).narrow(0, mv[g], a.size(1) - mv[g]).zero_();
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
  const std::vector<Segment> segments = layout_segments(kKGrouped, layout, psum, alignment, a.size(0), num_groups);
  const at::ScalarType acc_t = a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // A reduced-precision result without c where no group has two runs of rows (the psum layout's case): each group's
  // GEMM writes its output directly, FP32 accumulation and one rounding inside the worker, as a loop of torch.mm
  // would; no [G, M, N] FP32 accumulator (its fresh pages alone cost more than the GEMMs in bench grouped).
  std::vector<int64_t> runs(num_groups, 0);
  for (const Segment& s : segments) runs[s.group] += s.end > s.begin;
  if (out_t != acc_t && !c.has_value() && std::all_of(runs.begin(), runs.end(), [](int64_t n) { return n <= 1; })) {
    at::Tensor out = at::empty(shape, a.options().dtype(out_t));
    for (const Segment& s : segments) {
      if (s.end == s.begin) continue;
      at::Tensor out_g = out.select(0, s.group);
      const int64_t len = s.end - s.begin;
      matmul_into(out_g, a.narrow(0, s.begin, len).t(), b.narrow(0, s.begin, len).t(), std::nullopt, 1.0);
    }
    for (int64_t g = 0; g < num_groups; ++g) {
      if (!runs[g]) out.select(0, g).zero_();
    }
    return out;
  }
  // One accumulator for all segments of a group: a group split into several runs still rounds once.
  // A contiguous copy of c: the output's layout is the fake's (row-major), whatever c's strides are.
  at::Tensor acc = c.has_value() ? c->to(acc_t, false, /*copy=*/true, at::MemoryFormat::Contiguous)
                                 : at::empty(shape, a.options().dtype(acc_t));
  // Without c a group's first segment writes its accumulator (no zero-fill pass) and later ones add to it;
  // groups without rows are zeroed.
  std::vector<char> started(num_groups, c.has_value() ? 1 : 0);
  for (const Segment& s : segments) {
    if (s.end == s.begin) continue;
    at::Tensor acc_g = acc.select(0, s.group);
    const int64_t len = s.end - s.begin;
    const std::optional<at::Tensor> prior = started[s.group] ? std::optional<at::Tensor>(acc_g) : std::nullopt;
    matmul_into(acc_g, a.narrow(0, s.begin, len).t(), b.narrow(0, s.begin, len).t(), prior, 1.0);
    started[s.group] = 1;
  }
  for (int64_t g = 0; g < num_groups; ++g) {
    if (!started[g]) acc.select(0, g).zero_();
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
  fp8_gemm::check_fp8_operand(op, "a", "sfa", a, sfa, recipe_a, a, a_batched);
  check_rank(op, "b", b, 3, "[G, N, K] (FP8) or [G, N, K/2] (FP4 packed in uint8)");
  if (a_batched) check_dim_size(op, "b", b, 0, "groups", a.size(0), "a.size(0)");
  fp8_gemm::check_fp8_operand(op, "b", "sfb", b, sfb, recipe_b, a, true);
  fp8_gemm::check_fp8_pairing(op, a, b);
  return fp8_gemm::check_scaled_out_dtype(op, std::nullopt, out_dtype, at::kBFloat16);
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
  fp8_linear::check_high_precision(kLinearFp8, "x", x, "[M, K]");
  check_rank(kLinearFp8, "weight", weight, 3, "[G, N, K]");
  AM_CHECK_ARG(weight.scalar_type() == x.scalar_type(), kLinearFp8, "weight", "dtype",
               dtype_name(x.scalar_type()) + " (same as 'x')", dtype_name(weight.scalar_type()));
  check_same_device(kLinearFp8, "weight", weight, x);
  check_dim_size(kLinearFp8, "weight", weight, 2, "K", x.size(1), "x.size(1)");
  fp8_linear::check_k_blocks(kLinearFp8, "block", block, x);
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

// The per-token cast inside the grouped GEMM: each expert segment's rows cast 1 x gran_k (quantize_blocks, bit for
// bit quantize_fp8's) right before its GEMM, so the FP8 copy in memory is one segment's, never all of x's, and rows
// no expert owns (alignment padding, possibly uninitialized) are never read.
at::Tensor m_grouped_fp8_quant_gemm_cpu(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                                        const at::Tensor& layout, bool psum, int64_t alignment, int64_t gran_k,
                                        at::IntArrayRef recipe_b, bool use_ue8m0,
                                        std::optional<at::ScalarType> out_dtype) {
  fp8_linear::check_high_precision(kQuantFp8, "x", x, "[M, K]");
  fp8_linear::check_k_blocks(kQuantFp8, "gran_k", gran_k, x);
  check_rank(kQuantFp8, "b", b, 3, "[G, N, K] (FP8) or [G, N, K/2] (FP4 packed in uint8)");
  fp8_gemm::check_fp8_operand(kQuantFp8, "b", "sfb", b, sfb, recipe_b, x, true);
  AM_CHECK_ARG(logical_k(b) == x.size(1), kQuantFp8, "b", "K", std::to_string(x.size(1)) + " (x's K)", logical_k(b));
  check_alignment(kQuantFp8, alignment);
  check_layout_tensor(kQuantFp8, layout, psum, psum ? b.size(0) : x.size(0), x);
  const at::ScalarType out_t = fp8_gemm::check_scaled_out_dtype(kQuantFp8, std::nullopt, out_dtype, x.scalar_type());
  const std::array<int64_t, 2> shape{x.size(0), b.size(1)};
  const auto segments = layout_segments(kQuantFp8, layout, psum, alignment, x.size(0), b.size(0));
  const std::array<int64_t, 2> recipe_a{1, gran_k};
  return with_fp32_accumulator(shape, out_t, at::Tensor(), x.options(), [&](at::Tensor& acc) {
    for (const Segment& s : segments) {
      if (s.end == s.begin) continue;
      const int64_t len = s.end - s.begin;
      const auto [q, sf] = quantize_blocks(x.narrow(0, s.begin, len), 1, gran_k, use_ue8m0);
      at::Tensor rows = acc.narrow(0, s.begin, len);
      fp8_gemm_accumulate(rows, q, sf, b.select(0, s.group), sfb.select(0, s.group), recipe_a, recipe_b, 1.0);
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
  const at::ScalarType out_t = fp8_gemm::check_scaled_out_dtype(kKGroupedFp8, c, out_dtype, at::kFloat);
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


// ---- m_grouped_bf16_gemm_swiglu: the expert MLP's first GEMM with its SwiGLU(-quant) epilogue ----
// One task per (expert segment, column tile): the tile's gate rows and up rows of B are converted once and
// multiplied with the segment's rows in blocks; each [rows, 2 x tile] FP32 block is rounded to a's dtype (the
// L1 output the unfused pipeline stores), then gated, weighted and rounded (or quantized) straight into the
// output. No [M, 2I] intermediate exists; the epilogue runs ATen's own kernels (silu, clamp, the casts), so it
// matches the unfused composition element for element.

constexpr const char* kSwiglu = "ascend_moe::m_grouped_bf16_gemm_swiglu";
constexpr int64_t kSwigluRowBlock = 256;
// FP32 elements of B per task (gate + up rows of one column tile): about 1 MiB, L2-resident across row blocks.
constexpr int64_t kSwigluTileElements = int64_t{1} << 18;

struct SwigluEpilogue {
  const std::optional<at::Tensor>& row_weights;
  std::optional<double> clamp;
  int64_t gran;  // 0: rounded output, else FP8 with 1 x gran scales
  bool ue8m0;
  at::ScalarType compute_t;
  at::Tensor out, sf;

  // h [rows, 2w]: the L1 output's gate columns [j0, j0 + w) then its up columns, for rows [r0, r0 + rows).
  void operator()(const at::Tensor& h, int64_t r0, int64_t j0, int64_t w) const {
    (*this)(h.narrow(1, 0, w), h.narrow(1, w, w), r0, j0, w);
  }

  // The same with the gate and up columns [rows, w] as two tensors.
  void operator()(const at::Tensor& gate_h, const at::Tensor& up_h, int64_t r0, int64_t j0, int64_t w) const {
    const int64_t rows = gate_h.size(0);
    at::Tensor gate = gate_h.to(compute_t), up = up_h.to(compute_t);
    if (clamp.has_value()) {
      gate = gate.clamp_max(*clamp);
      up = up.clamp(-*clamp, *clamp);
    }
    at::Tensor act = at::silu(gate).mul_(up);
    if (row_weights.has_value()) act.mul_(row_weights->narrow(0, r0, rows).unsqueeze(1));
    at::Tensor out_tile = out.narrow(0, r0, rows).narrow(1, j0, w);
    if (gran == 0) {
      out_tile.copy_(act);
      return;
    }
    const auto [q, scales] = quantize_blocks(act, 1, gran, ue8m0);
    out_tile.copy_(q);
    sf.narrow(0, r0, rows).narrow(1, j0 / gran, scales.size(1)).copy_(scales);
  }

  // The epilogue of an [M, I] output (FP8 with its [M, ceil(I / gran)] FP32 scales where gran > 0, else [M, 0]).
  static SwigluEpilogue make(const std::optional<at::Tensor>& row_weights, std::optional<double> clamp, int64_t gran,
                             bool ue8m0, at::ScalarType compute_t, at::ScalarType out_t, int64_t M, int64_t I,
                             const at::TensorOptions& options) {
    const int64_t scale_cols = gran > 0 ? (I + gran - 1) / gran : 0;
    return {row_weights,
            clamp,
            gran,
            ue8m0,
            compute_t,
            at::empty({M, I}, options.dtype(out_t)),
            at::empty({M, scale_cols}, options.dtype(at::kFloat))};
  }
};

struct SwigluTask {
  int64_t group, begin, end, j0, w;  // group -1: rows no group owns (their L1 output is zero)
};

void check_even_gate_up(const char* op, const at::Tensor& b) {
  AM_CHECK_ARG(b.size(1) % 2 == 0, op, "b", "size(1) (2I: gate rows, then up rows)", "an even number", b.size(1));
}

// The epilogue's arguments, checked alike by both SwiGLU ops (twin of meta.grouped.check_swiglu_epilogue); returns
// the output dtype, `plain_out` resolving out_dtype when the output is not quantized.
template <typename PlainOut>
at::ScalarType check_swiglu_epilogue(const char* op, const at::Tensor& a, at::ScalarType compute_t,
                                     const std::optional<at::Tensor>& row_weights,
                                     std::optional<double> activation_clamp, int64_t quant_gran_k, bool use_ue8m0,
                                     std::optional<at::ScalarType> out_dtype, PlainOut plain_out) {
  if (row_weights.has_value()) {
    check_rank(op, "row_weights", *row_weights, 1, "[M] (one routing weight per row of a)");
    AM_CHECK_ARG(row_weights->scalar_type() == compute_t, op, "row_weights", "dtype",
                 dtype_name(compute_t) + " (the epilogue's precision for a " + dtype_name(a.scalar_type()) + ")",
                 dtype_name(row_weights->scalar_type()));
    check_same_device(op, "row_weights", *row_weights, a);
    check_dim_size(op, "row_weights", *row_weights, 0, "M", a.size(0), "a.size(0)");
  }
  if (activation_clamp.has_value()) {
    AM_CHECK_ARG(*activation_clamp >= 0, op, "activation_clamp", "value", "None or >= 0",
                 float_text(*activation_clamp));
  }
  check_int_arg(op, "quant_gran_k", quant_gran_k, 0);
  if (quant_gran_k > 0) {
    AM_CHECK_ARG(!out_dtype.has_value() || *out_dtype == at::kFloat8_e4m3fn, op, "out_dtype", "value",
                 "None or torch.float8_e4m3fn (quant_gran_k > 0)", dtype_name(*out_dtype));
    return at::kFloat8_e4m3fn;
  }
  AM_CHECK_ARG(!use_ue8m0, op, "use_ue8m0", "value", "False when quant_gran_k=0 (no FP8 output)", "True");
  return plain_out(out_dtype);
}

// Column tiles of the L1 output's I columns: multiples of `unit` (a quantization group never straddles two tasks),
// `tile` sized for the cache, `stream` for few-row segments (which stream B once whatever the tile: as wide as the
// threads allow, since many narrow GEMM calls cost more than the work); both narrowed until every thread has work.
struct SwigluTiles {
  int64_t tile, stream;
};

SwigluTiles swiglu_tiles(int64_t I, int64_t K, int64_t unit, size_t segments) {
  const auto round_up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  const int64_t tile = round_up(std::max<int64_t>(1, kSwigluTileElements / (2 * std::max<int64_t>(K, 1))), unit);
  const int64_t busy = std::max<int64_t>(1, static_cast<int64_t>(segments));
  const int64_t tiles_wanted = (2 * at::get_num_threads() + busy - 1) / busy;
  const int64_t parallel_tile = round_up((I + tiles_wanted - 1) / tiles_wanted, unit);
  const int64_t whole = round_up(I, unit);
  return {std::min({tile, parallel_tile, whole}), std::min(parallel_tile, whole)};
}

// One task per (segment, column tile of width `width(segment)`), then one per run of rows no group owns (the
// epilogue of a zero L1 output, full width).
template <typename Width>
std::vector<SwigluTask> swiglu_tasks(const std::vector<Segment>& segments, int64_t M, int64_t I, Width width) {
  std::vector<SwigluTask> tasks;
  std::vector<char> owned(M, 0);
  for (const Segment& s : segments) {
    std::fill(owned.begin() + s.begin, owned.begin() + s.end, 1);
    if (s.end == s.begin) continue;
    const int64_t w = width(s);
    for (int64_t j0 = 0; j0 < I; j0 += w) tasks.push_back({s.group, s.begin, s.end, j0, std::min(w, I - j0)});
  }
  for (int64_t r = 0; r < M;) {
    if (owned[r]) {
      ++r;
      continue;
    }
    int64_t e = r;
    while (e < M && !owned[e]) ++e;
    tasks.push_back({-1, r, e, 0, I});
    r = e;
  }
  return tasks;
}

// The epilogue of rows no group owns: h = 0, in row blocks.
void swiglu_unowned(const SwigluEpilogue& epilogue, const SwigluTask& task, at::ScalarType h_t,
                    const at::TensorOptions& options) {
  for (int64_t r0 = task.begin; r0 < task.end; r0 += kSwigluRowBlock) {
    const int64_t rows = std::min(kSwigluRowBlock, task.end - r0);
    epilogue(at::zeros({rows, 2 * task.w}, options.dtype(h_t)), r0, task.j0, task.w);
  }
}

std::tuple<at::Tensor, at::Tensor> m_grouped_bf16_gemm_swiglu_cpu(
    const at::Tensor& a_in, const at::Tensor& b_in, const at::Tensor& layout, bool psum, int64_t alignment,
    const std::optional<at::Tensor>& weights_in, std::optional<double> activation_clamp, int64_t quant_gran_k,
    bool use_ue8m0, std::optional<at::ScalarType> out_dtype) {
  const char* op = kSwiglu;
  // The tasks run ATen ops on worker threads, which do not inherit the caller's "below autograd" dispatch state:
  // detached operands keep them from recording (or refusing, for out= ops) autograd history.
  const at::Tensor a = a_in.detach(), b = b_in.detach();
  const std::optional<at::Tensor> row_weights =
      weights_in.has_value() ? std::optional<at::Tensor>(weights_in->detach()) : std::nullopt;
  check_m_operands(op, a, b, "[G, 2I, K] (gate rows, then up rows)");
  check_even_gate_up(op, b);
  check_alignment(op, alignment);
  check_layout_tensor(op, layout, psum, psum ? b.size(0) : a.size(0), a);
  const at::ScalarType compute_t = a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::ScalarType out_t =
      check_swiglu_epilogue(op, a, compute_t, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype,
                            [&](std::optional<at::ScalarType> dt) { return resolve_out_dtype(op, a, std::nullopt, dt); });

  const int64_t M = a.size(0), K = a.size(1), I = b.size(1) / 2;
  const SwigluEpilogue epilogue = SwigluEpilogue::make(row_weights, activation_clamp, quant_gran_k, use_ue8m0,
                                                       compute_t, out_t, M, I, a.options());
  const auto segments = layout_segments(op, layout, psum, alignment, M, b.size(0));
  if (M == 0 || I == 0) return {epilogue.out, epilogue.sf};

  const SwigluTiles tiles = swiglu_tiles(I, K, quant_gran_k > 0 ? quant_gran_k : 16, segments.size());
  const at::ScalarType h_t = a.scalar_type();
  // BF16 on a CPU with BF16 dot products, every product normal: ATen's BF16 GEMM per tile (see below).
  const bool native_tiles = h_t == at::kBFloat16 && native_bf16_dot() && bf16_products_normal(a, b);
  // Few-row segments stream B once, and ATen's BF16 GEMM reads B in place (no tile to keep in cache).
  const auto tasks = swiglu_tasks(segments, M, I, [&](const Segment& s) {
    return native_tiles || s.end - s.begin <= kStreamingMaxRows ? tiles.stream : tiles.tile;
  });

  const at::Tensor a_acc = native_tiles ? a : a.to(compute_t);
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const SwigluTask& task = tasks[t];
      if (task.group < 0) {
        swiglu_unowned(epilogue, task, h_t, a.options());
        continue;
      }
      const at::Tensor bg = b.select(0, task.group);
      if (task.end - task.begin <= kStreamingMaxRows) {
        // Few rows: memory-bound on B, which the streaming kernel reads once in BF16 (no FP32 copy of the tile).
        const at::Tensor rows = a.narrow(0, task.begin, task.end - task.begin);
        at::Tensor h = at::empty({rows.size(0), 2 * task.w}, a.options().dtype(h_t));
        at::Tensor gate = h.narrow(1, 0, task.w), up = h.narrow(1, task.w, task.w);
        matmul_into(gate, rows, bg.narrow(0, task.j0, task.w), std::nullopt, 1.0);
        matmul_into(up, rows, bg.narrow(0, I + task.j0, task.w), std::nullopt, 1.0);
        epilogue(h, task.begin, task.j0, task.w);
        continue;
      }
      if (native_tiles) {
        // BF16 on a CPU with BF16 dot products: ATen's BF16 GEMM gives the rounded L1 output directly (FP32
        // accumulation, one rounding: the definition), 2-4x faster than SGEMM on an FP32 copy of the tile. It
        // reads the gate and up rows of B in place (a transposed view, as F.linear): no copy of the tile, which at
        // few rows per expert would cost more than the GEMM.
        const at::Tensor b_gate = bg.narrow(0, task.j0, task.w).t(), b_up = bg.narrow(0, I + task.j0, task.w).t();
        for (int64_t r0 = task.begin; r0 < task.end; r0 += kSwigluRowBlock) {
          const at::Tensor rows = a.narrow(0, r0, std::min(kSwigluRowBlock, task.end - r0));
          epilogue(at::mm(rows, b_gate), at::mm(rows, b_up), r0, task.j0, task.w);
        }
        continue;
      }
      at::Tensor bt = at::empty({2 * task.w, K}, a.options().dtype(compute_t));
      bt.narrow(0, 0, task.w).copy_(bg.narrow(0, task.j0, task.w));
      bt.narrow(0, task.w, task.w).copy_(bg.narrow(0, I + task.j0, task.w));
      for (int64_t r0 = task.begin; r0 < task.end; r0 += kSwigluRowBlock) {
        const int64_t rows = std::min(kSwigluRowBlock, task.end - r0);
        // FP32 accumulation (FP64 for FP64), then the one rounding of the L1 output.
        epilogue(at::mm(a_acc.narrow(0, r0, rows), bt.t()).to(h_t), r0, task.j0, task.w);
      }
    }
  });
  return {epilogue.out, epilogue.sf};
}

// ---- m_grouped_fp8_gemm_swiglu: the same with FP8 (or packed FP4) L1 operands ----
// h = bf16(deq(A) @ deq(B)^T) (the L1 output m_grouped_fp8_gemm writes), then the same epilogue. Tasks as above:
// each many-row task decodes its gate and up rows of B to FP32 once (scale rows found by absolute row, so a tile
// need not start on a scale block) and runs SGEMM per row block; few-row segments take the FP8 GEMM's streaming
// kernel (B decoded in registers, read once) on the tile's rows of B and of its scales.

constexpr const char* kSwigluFp8 = "ascend_moe::m_grouped_fp8_gemm_swiglu";

std::tuple<at::Tensor, at::Tensor> m_grouped_fp8_gemm_swiglu_cpu(
    const at::Tensor& a_in, const at::Tensor& sfa_in, const at::Tensor& b_in, const at::Tensor& sfb_in,
    const at::Tensor& layout, bool psum, int64_t alignment, at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
    const std::optional<at::Tensor>& weights_in, std::optional<double> activation_clamp, int64_t quant_gran_k,
    bool use_ue8m0, std::optional<at::ScalarType> out_dtype) {
  const char* op = kSwigluFp8;
  // Detached for the worker threads, as in m_grouped_bf16_gemm_swiglu_cpu.
  const at::Tensor a = a_in.detach(), sfa = sfa_in.detach(), b = b_in.detach(), sfb = sfb_in.detach();
  const std::optional<at::Tensor> row_weights =
      weights_in.has_value() ? std::optional<at::Tensor>(weights_in->detach()) : std::nullopt;
  check_grouped_fp8(op, a, sfa, b, sfb, recipe_a, recipe_b, false, std::nullopt);
  check_even_gate_up(op, b);
  check_alignment(op, alignment);
  check_layout_tensor(op, layout, psum, psum ? b.size(0) : a.size(0), a);
  const at::ScalarType out_t = check_swiglu_epilogue(
      op, a, at::kFloat, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype,
      [&](std::optional<at::ScalarType> dt) {
        return fp8_gemm::check_scaled_out_dtype(op, std::nullopt, dt, at::kBFloat16);
      });

  const int64_t M = a.size(0), K = logical_k(a), I = b.size(1) / 2;
  const SwigluEpilogue epilogue = SwigluEpilogue::make(row_weights, activation_clamp, quant_gran_k, use_ue8m0,
                                                       at::kFloat, out_t, M, I, a.options());
  const auto segments = layout_segments(op, layout, psum, alignment, M, b.size(0));
  if (M == 0 || I == 0) return {epilogue.out, epilogue.sf};

  const int64_t gran_n = recipe_b[0];
  const int64_t unit = quant_gran_k > 0 ? quant_gran_k : 16;
  const SwigluTiles tiles = swiglu_tiles(I, K, unit, segments.size());
  // The streaming kernel takes B's scales as whole blocks of gran_n rows: its tiles start on block boundaries (the
  // up half too, so I must be whole blocks), else one task covers all 2I columns.
  const int64_t stream_unit = std::lcm(unit, gran_n);
  const int64_t stream_width =
      I % gran_n == 0 ? std::min(I, std::max(stream_unit, tiles.stream / stream_unit * stream_unit)) : I;
  // (Many-row tasks as wide as the threads allow, decoding A once instead of I / tile times, measured no faster on
  // the MoE layer of bench compile: 250 vs 241 ms, 21 interleaved runs.)
  const auto tasks = swiglu_tasks(segments, M, I, [&](const Segment& s) {
    return s.end - s.begin <= kStreamingMaxRows ? stream_width : tiles.tile;
  });

  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const SwigluTask& task = tasks[t];
      if (task.group < 0) {
        swiglu_unowned(epilogue, task, at::kBFloat16, a.options());
        continue;
      }
      const at::Tensor bg = b.select(0, task.group), sg = sfb.select(0, task.group);
      const int64_t len = task.end - task.begin;
      if (len <= kStreamingMaxRows) {
        // m_grouped_fp8_gemm's own path for these rows (streaming, or dequantized panels where scales overflow).
        const at::Tensor rows = a.narrow(0, task.begin, len), row_sf = sfa.narrow(0, task.begin, len);
        at::Tensor acc = at::zeros({len, 2 * task.w}, a.options().dtype(at::kFloat));
        if (task.w == I) {
          fp8_gemm_accumulate(acc, rows, row_sf, bg, sg, recipe_a, recipe_b, 1.0);
        } else {
          const int64_t blocks = (task.w + gran_n - 1) / gran_n;
          for (const int64_t half : {int64_t{0}, I}) {
            at::Tensor part = acc.narrow(1, half == 0 ? 0 : task.w, task.w);
            fp8_gemm_accumulate(part, rows, row_sf, bg.narrow(0, half + task.j0, task.w),
                                sg.narrow(0, (half + task.j0) / gran_n, blocks), recipe_a, recipe_b, 1.0);
          }
        }
        epilogue(acc.to(at::kBFloat16), task.begin, task.j0, task.w);
        continue;
      }
      // The tile's gate rows then its up rows of B, decoded to FP32 once (each half in place): one GEMM per row
      // block, its A rows and FP32 product in buffers the task reuses.
      at::Tensor bt = at::empty({2 * task.w, K}, a.options().dtype(at::kFloat));
      for (const int64_t half : {int64_t{0}, int64_t{1}}) {
        at::Tensor rows_of_half = bt.narrow(0, half * task.w, task.w);
        dequantize_rows_into(rows_of_half, bg, sg, gran_n, recipe_b[1], half * I + task.j0);
      }
      const int64_t block = std::min(kSwigluRowBlock, len);
      const at::Tensor a_buf = at::empty({block, K}, a.options().dtype(at::kFloat));
      const at::Tensor h_buf = at::empty({block, 2 * task.w}, a.options().dtype(at::kFloat));
      for (int64_t r0 = task.begin; r0 < task.end; r0 += kSwigluRowBlock) {
        const int64_t rows = std::min(kSwigluRowBlock, task.end - r0);
        at::Tensor a_deq = a_buf.narrow(0, 0, rows), h = h_buf.narrow(0, 0, rows);
        dequantize_rows_into(a_deq, a, sfa, 1, recipe_a[1], r0);
        // FP32 accumulation, then the one rounding of the L1 output to BF16.
        epilogue(at::mm_out(h, a_deq, bt.t()).to(at::kBFloat16), r0, task.j0, task.w);
      }
    }
  });
  return {epilogue.out, epilogue.sf};
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

  // The experts' first GEMM with its SwiGLU epilogue: h = round(A[i] @ B[g(i)]^T) in a's dtype (B [G, 2I, K], gate
  // rows then up rows), act = silu(gate) * up (* row_weights[i]) in FP32 (FP64 for FP64), gate clamped to <= c and
  // up to [-c, c] first; out [M, I] rounded to out_dtype, or FP8 E4M3 with 1 x quant_gran_k scales [M, ceil(I /
  // quant_gran_k)] (power-of-two with use_ue8m0); the scales are [M, 0] without quantization. Rows no group owns
  // go through the epilogue with h = 0.
  m.def(
      "m_grouped_bf16_gemm_swiglu(Tensor a, Tensor b, Tensor layout, bool psum=True, int alignment=1, "
      "Tensor? row_weights=None, float? activation_clamp=None, int quant_gran_k=0, bool use_ue8m0=False, "
      "ScalarType? out_dtype=None) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});

  // Scaled variants (operands and scales as in fp8_gemm; A scales per row, recipe_a = [1, gran_k]).
  m.def(
      "m_grouped_fp8_gemm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor layout, bool psum=True, "
      "int alignment=1, int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // m_grouped_bf16_gemm_swiglu with a scaled L1 (operands and scales as m_grouped_fp8_gemm): h =
  // bf16(deq(A)[i] @ deq(B)[g(i)]^T), B [G, 2I, K]; the same epilogue (FP32, row_weights FP32); out BF16 (default)
  // or FP32, or FP8 E4M3 with 1 x quant_gran_k scales.
  m.def(
      "m_grouped_fp8_gemm_swiglu(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor layout, bool psum=True, "
      "int alignment=1, int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], Tensor? row_weights=None, "
      "float? activation_clamp=None, int quant_gran_k=0, bool use_ue8m0=False, ScalarType? out_dtype=None) "
      "-> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "m_grouped_fp8_gemm_masked(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor masked_m, "
      "int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // The per-token cast feeding m_grouped_fp8_gemm, inside the op (inference FP8 experts on BF16/FP32 tokens):
  // x [M, K] cast 1 x gran_k (as quantize_fp8(x, [1, gran_k], use_ue8m0)), times the pre-quantized experts
  // (b, sfb) as m_grouped_fp8_gemm's; output x's dtype by default (BF16 or FP32). Straight-through gradient for x.
  m.def(
      "m_grouped_fp8_quant_gemm(Tensor x, Tensor b, Tensor sfb, Tensor layout, bool psum=True, int alignment=1, "
      "int gran_k=128, int[2] recipe_b=[128, 128], bool use_ue8m0=False, ScalarType? out_dtype=None) -> Tensor",
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
  m.impl("m_grouped_bf16_gemm_swiglu", &m_grouped_bf16_gemm_swiglu_cpu);
  m.impl("k_grouped_bf16_gemm", &k_grouped_bf16_gemm_cpu);
  m.impl("m_grouped_fp8_gemm", &m_grouped_fp8_gemm_cpu);
  m.impl("m_grouped_fp8_gemm_masked", &m_grouped_fp8_gemm_masked_cpu);
  m.impl("m_grouped_fp8_gemm_swiglu", &m_grouped_fp8_gemm_swiglu_cpu);
  m.impl("m_grouped_fp8_linear", &m_grouped_fp8_linear_cpu);
  m.impl("m_grouped_fp8_quant_gemm", &m_grouped_fp8_quant_gemm_cpu);
  m.impl("k_grouped_fp8_gemm", &k_grouped_fp8_gemm_cpu);
}

}  // namespace ascend_moe
