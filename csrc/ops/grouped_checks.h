// The grouped family's argument checks (the m-grouped, masked and k-grouped GEMMs, BF16 and FP8, and the SwiGLU
// ops), and the layout's value checks its kernels make. Twin: torch_ascend_moe/checks/grouped.py (the same checks in
// the same order, the same words; tests/test_validation_twins.py compares them).
//
// Layouts (specs/deepgemm_api.md §4, §6): psum = cumulative group ends [G] (torch._grouped_mm's `offs`), group g
// spans rows [align(end_{g-1}, alignment), end_g); ids = one group id per row [M], -1 = padding.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "fp8_gemm_checks.h"
#include "fp8_linear_checks.h"

namespace ascend_moe::grouped {

constexpr const char* kMGrouped = "ascend_moe::m_grouped_bf16_gemm";
constexpr const char* kMasked = "ascend_moe::m_grouped_bf16_gemm_masked";
constexpr const char* kKGrouped = "ascend_moe::k_grouped_bf16_gemm";
constexpr const char* kMGroupedFp8 = "ascend_moe::m_grouped_fp8_gemm";
constexpr const char* kMaskedFp8 = "ascend_moe::m_grouped_fp8_gemm_masked";
constexpr const char* kLinearFp8 = "ascend_moe::m_grouped_fp8_linear";
constexpr const char* kQuantFp8 = "ascend_moe::m_grouped_fp8_quant_gemm";
constexpr const char* kKGroupedFp8 = "ascend_moe::k_grouped_fp8_gemm";
constexpr const char* kSwiglu = "ascend_moe::m_grouped_bf16_gemm_swiglu";
constexpr const char* kSwigluFp8 = "ascend_moe::m_grouped_fp8_gemm_swiglu";

// The output shape and dtype of a call.
using Signature = std::pair<std::vector<int64_t>, at::ScalarType>;

struct Segment {
  int64_t group, begin, end;  // rows [begin, end) belong to `group`
};

inline void check_layout_tensor(const char* op, const at::Tensor& layout, bool psum, int64_t length,
                                const at::Tensor& ref) {
  check_rank(op, "layout", layout, 1, psum ? "[G] (cumulative group ends)" : "[M] (group id per row, -1 = padding)");
  AM_CHECK_ARG(layout.scalar_type() == at::kInt, op, "layout", "dtype", "torch.int32",
               dtype_name(layout.scalar_type()));
  check_same_device(op, "layout", layout, ref);
  check_dim_size(op, "layout", layout, 0, psum ? "groups" : "rows", length, psum ? "b's groups" : "rows of a");
}

inline void check_alignment(const char* op, int64_t alignment) { check_int_arg(op, "alignment", alignment, 1); }

// The rows of each group, validated against the data (a kernel's check: a fake cannot see values).
inline std::vector<Segment> layout_segments(const char* op, const at::Tensor& layout, bool psum, int64_t alignment,
                                            int64_t rows, int64_t groups) {
  const at::Tensor values = layout.to(at::kCPU, at::kLong).contiguous();
  const int64_t* v = values.const_data_ptr<int64_t>();
  std::vector<Segment> segments;
  if (psum) {
    int64_t prev = 0;
    for (int64_t g = 0; g < values.numel(); ++g) {
      const int64_t start = (prev + alignment - 1) / alignment * alignment;
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

// An m-grouped GEMM's operands: tokens a [M, K], expert weights b [G, N, K] of a's dtype and device.
inline void check_m_operands(const char* op, const at::Tensor& a, const at::Tensor& b, const char* b_layout) {
  check_rank(op, "a", a, 2, "[M, K]");
  check_rank(op, "b", b, 3, b_layout);
  check_operand_dtypes(op, a, b);
  check_same_device(op, "b", b, a);
  check_dim_size(op, "b", b, 2, "K", a.size(1), "a.size(1)");
}

inline Signature m_grouped_signature(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout, bool psum,
                                     int64_t alignment, std::optional<at::ScalarType> out_dtype) {
  check_m_operands(kMGrouped, a, b, "[G, N, K]");
  check_alignment(kMGrouped, alignment);
  check_layout_tensor(kMGrouped, layout, psum, psum ? b.size(0) : a.size(0), a);
  return {{a.size(0), b.size(1)}, resolve_out_dtype(kMGrouped, a, std::nullopt, out_dtype)};
}

inline void check_even_gate_up(const char* op, const at::Tensor& b) {
  AM_CHECK_ARG(b.size(1) % 2 == 0, op, "b", "size(1) (2I: gate rows, then up rows)", "an even number", b.size(1));
}

// The epilogue's arguments, checked alike by both SwiGLU ops; returns the output dtype, `plain_out` resolving
// out_dtype when the output is not quantized.
template <typename PlainOut>
at::ScalarType check_swiglu_epilogue(const char* op, const at::Tensor& a, at::ScalarType compute,
                                     const std::optional<at::Tensor>& row_weights,
                                     std::optional<double> activation_clamp, int64_t quant_gran_k, bool use_ue8m0,
                                     std::optional<at::ScalarType> out_dtype, PlainOut plain_out) {
  if (row_weights.has_value()) {
    check_rank(op, "row_weights", *row_weights, 1, "[M] (one routing weight per row of a)");
    AM_CHECK_ARG(row_weights->scalar_type() == compute, op, "row_weights", "dtype",
                 dtype_name(compute) + " (the epilogue's precision for a " + dtype_name(a.scalar_type()) + ")",
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

// Checks an m_grouped_bf16_gemm_swiglu call; returns the output dtype.
inline at::ScalarType swiglu_signature(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout, bool psum,
                                       int64_t alignment, const std::optional<at::Tensor>& row_weights,
                                       std::optional<double> activation_clamp, int64_t quant_gran_k, bool use_ue8m0,
                                       std::optional<at::ScalarType> out_dtype) {
  check_m_operands(kSwiglu, a, b, "[G, 2I, K] (gate rows, then up rows)");
  check_even_gate_up(kSwiglu, b);
  check_alignment(kSwiglu, alignment);
  check_layout_tensor(kSwiglu, layout, psum, psum ? b.size(0) : a.size(0), a);
  const at::ScalarType compute = a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  return check_swiglu_epilogue(
      kSwiglu, a, compute, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype,
      [&](std::optional<at::ScalarType> out) { return resolve_out_dtype(kSwiglu, a, std::nullopt, out); });
}

inline void check_masked_m(const char* op, const at::Tensor& masked_m, const at::Tensor& a) {
  check_rank(op, "masked_m", masked_m, 1, "[G]");
  AM_CHECK_ARG(masked_m.scalar_type() == at::kInt, op, "masked_m", "dtype", "torch.int32",
               dtype_name(masked_m.scalar_type()));
  check_same_device(op, "masked_m", masked_m, a);
  check_dim_size(op, "masked_m", masked_m, 0, "groups", a.size(0), "a.size(0)");
}

// masked_m's values, each checked to lie in [0, M_max] (a kernel's check: a fake cannot see values).
inline std::vector<int64_t> masked_rows(const char* op, const at::Tensor& masked_m, int64_t m_max) {
  const at::Tensor m = masked_m.to(at::kCPU, at::kLong).contiguous();
  std::vector<int64_t> rows(m.const_data_ptr<int64_t>(), m.const_data_ptr<int64_t>() + m.numel());
  for (size_t g = 0; g < rows.size(); ++g) {
    AM_CHECK_ARG(rows[g] >= 0 && rows[g] <= m_max, op, "masked_m", "values",
                 "in [0, M_max=" + std::to_string(m_max) + "]",
                 "masked_m[" + std::to_string(g) + "] = " + std::to_string(rows[g]));
  }
  return rows;
}

inline Signature masked_signature(const at::Tensor& a, const at::Tensor& b, const at::Tensor& masked_m,
                                  std::optional<at::ScalarType> out_dtype) {
  check_rank(kMasked, "a", a, 3, "[G, M_max, K]");
  check_rank(kMasked, "b", b, 3, "[G, N, K]");
  check_operand_dtypes(kMasked, a, b);
  check_same_device(kMasked, "b", b, a);
  check_dim_size(kMasked, "b", b, 0, "groups", a.size(0), "a.size(0)");
  check_dim_size(kMasked, "b", b, 2, "K", a.size(2), "a.size(2)");
  check_masked_m(kMasked, masked_m, a);
  return {{a.size(0), a.size(1), b.size(1)}, resolve_out_dtype(kMasked, a, std::nullopt, out_dtype)};
}

inline Signature k_grouped_signature(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout,
                                     int64_t num_groups, bool psum, int64_t alignment,
                                     const std::optional<at::Tensor>& c, std::optional<at::ScalarType> out_dtype) {
  check_rank(kKGrouped, "a", a, 2, "[S, M] (rows are the grouped reduction axis)");
  check_rank(kKGrouped, "b", b, 2, "[S, N]");
  check_operand_dtypes(kKGrouped, a, b);
  check_same_device(kKGrouped, "b", b, a);
  check_dim_size(kKGrouped, "b", b, 0, "S", a.size(0), "a.size(0)");
  check_alignment(kKGrouped, alignment);
  check_int_arg(kKGrouped, "num_groups", num_groups, 0);
  check_layout_tensor(kKGrouped, layout, psum, psum ? num_groups : a.size(0), a);
  const at::ScalarType dtype = resolve_out_dtype(kKGrouped, a, c, out_dtype);
  std::vector<int64_t> shape{num_groups, a.size(1), b.size(1)};
  check_accumulator(kKGrouped, c, a, shape);
  return {shape, dtype};
}

// Grouped A scales are per row (gran_mn 1): a block of rows could straddle two experts.
inline void check_row_scales(const char* op, at::IntArrayRef recipe_a) {
  AM_CHECK_ARG(recipe_a.size() == 2 && recipe_a[0] == 1, op, "recipe_a", "value",
               "[1, gran_k] (per-row A scales: a row block could straddle two experts)", shape_str(recipe_a));
}

// Scaled operands of the grouped FP8 GEMMs; returns the output dtype.
inline at::ScalarType check_grouped_fp8(const char* op, const at::Tensor& a, const at::Tensor& sfa,
                                        const at::Tensor& b, const at::Tensor& sfb, at::IntArrayRef recipe_a,
                                        at::IntArrayRef recipe_b, bool a_batched,
                                        std::optional<at::ScalarType> out_dtype) {
  check_row_scales(op, recipe_a);
  fp8_gemm::check_fp8_operand(op, "a", "sfa", a, sfa, recipe_a, a, a_batched);
  check_rank(op, "b", b, 3, "[G, N, K] (FP8) or [G, N, K/2] (FP4 packed in uint8)");
  if (a_batched) check_dim_size(op, "b", b, 0, "groups", a.size(0), "a.size(0)");
  fp8_gemm::check_fp8_operand(op, "b", "sfb", b, sfb, recipe_b, a, true);
  fp8_gemm::check_fp8_pairing(op, a, b);
  return fp8_gemm::check_scaled_out_dtype(op, std::nullopt, out_dtype, at::kBFloat16);
}

// Checks an m_grouped_fp8_gemm_swiglu call (operands as m_grouped_fp8_gemm's); returns the output dtype.
inline at::ScalarType swiglu_fp8_signature(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                           const at::Tensor& sfb, const at::Tensor& layout, bool psum,
                                           int64_t alignment, at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                                           const std::optional<at::Tensor>& row_weights,
                                           std::optional<double> activation_clamp, int64_t quant_gran_k,
                                           bool use_ue8m0, std::optional<at::ScalarType> out_dtype) {
  check_grouped_fp8(kSwigluFp8, a, sfa, b, sfb, recipe_a, recipe_b, false, std::nullopt);
  check_even_gate_up(kSwigluFp8, b);
  check_alignment(kSwigluFp8, alignment);
  check_layout_tensor(kSwigluFp8, layout, psum, psum ? b.size(0) : a.size(0), a);
  return check_swiglu_epilogue(kSwigluFp8, a, at::kFloat, row_weights, activation_clamp, quant_gran_k, use_ue8m0,
                               out_dtype, [&](std::optional<at::ScalarType> out) {
                                 return fp8_gemm::check_scaled_out_dtype(kSwigluFp8, std::nullopt, out, at::kBFloat16);
                               });
}

inline Signature m_grouped_fp8_signature(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                         const at::Tensor& sfb, const at::Tensor& layout, bool psum, int64_t alignment,
                                         at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                                         std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype =
      check_grouped_fp8(kMGroupedFp8, a, sfa, b, sfb, recipe_a, recipe_b, false, out_dtype);
  check_alignment(kMGroupedFp8, alignment);
  check_layout_tensor(kMGroupedFp8, layout, psum, psum ? b.size(0) : a.size(0), a);
  return {{a.size(0), b.size(1)}, dtype};
}

inline Signature masked_fp8_signature(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                      const at::Tensor& sfb, const at::Tensor& masked_m, at::IntArrayRef recipe_a,
                                      at::IntArrayRef recipe_b, std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType dtype = check_grouped_fp8(kMaskedFp8, a, sfa, b, sfb, recipe_a, recipe_b, true, out_dtype);
  check_masked_m(kMaskedFp8, masked_m, a);
  return {{a.size(0), a.size(1), b.size(1)}, dtype};
}

// Checks an m_grouped_fp8_linear call; returns the output shape.
inline std::vector<int64_t> m_grouped_fp8_linear_signature(const at::Tensor& x, const at::Tensor& weight,
                                                           const at::Tensor& layout, bool psum, int64_t alignment,
                                                           int64_t block) {
  fp8_linear::check_high_precision(kLinearFp8, "x", x, "[M, K]");
  check_rank(kLinearFp8, "weight", weight, 3, "[G, N, K]");
  AM_CHECK_ARG(weight.scalar_type() == x.scalar_type(), kLinearFp8, "weight", "dtype",
               dtype_name(x.scalar_type()) + " (same as 'x')", dtype_name(weight.scalar_type()));
  check_same_device(kLinearFp8, "weight", weight, x);
  check_dim_size(kLinearFp8, "weight", weight, 2, "K", x.size(1), "x.size(1)");
  fp8_linear::check_k_blocks(kLinearFp8, "block", block, x);
  check_alignment(kLinearFp8, alignment);
  check_layout_tensor(kLinearFp8, layout, psum, psum ? weight.size(0) : x.size(0), x);
  return {x.size(0), weight.size(1)};
}

// m_grouped_fp8_gemm's output for x cast per token inside the op (as fp8_quant_gemm: BF16/FP32 x, the output in
// x's dtype by default).
inline Signature m_grouped_fp8_quant_signature(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                                               const at::Tensor& layout, bool psum, int64_t alignment, int64_t gran_k,
                                               at::IntArrayRef recipe_b, std::optional<at::ScalarType> out_dtype) {
  fp8_linear::check_high_precision(kQuantFp8, "x", x, "[M, K]");
  fp8_linear::check_k_blocks(kQuantFp8, "gran_k", gran_k, x);
  check_rank(kQuantFp8, "b", b, 3, "[G, N, K] (FP8) or [G, N, K/2] (FP4 packed in uint8)");
  fp8_gemm::check_fp8_operand(kQuantFp8, "b", "sfb", b, sfb, recipe_b, x, true);
  AM_CHECK_ARG(fp8_gemm::logical_k(b) == x.size(1), kQuantFp8, "b", "K", std::to_string(x.size(1)) + " (x's K)",
               fp8_gemm::logical_k(b));
  check_alignment(kQuantFp8, alignment);
  check_layout_tensor(kQuantFp8, layout, psum, psum ? b.size(0) : x.size(0), x);
  return {{x.size(0), b.size(1)},
          fp8_gemm::check_scaled_out_dtype(kQuantFp8, std::nullopt, out_dtype, x.scalar_type())};
}

// Shapes and dtypes; the scale row count (sum of ceil(k_g / gran_k)) depends on layout values: k_fp8_segments.
inline Signature k_grouped_fp8_signature(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
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
  const at::ScalarType dtype = fp8_gemm::check_scaled_out_dtype(kKGroupedFp8, c, out_dtype, at::kFloat);
  std::vector<int64_t> shape{num_groups, a.size(1), b.size(1)};
  check_accumulator(kKGroupedFp8, c, a, shape);
  return {shape, dtype};
}

// k_grouped_fp8_gemm's groups after the value checks: the layout's, then that the scale tensors hold one row per
// gran_k rows of each group (the layout's values decide how many).
inline std::vector<Segment> k_fp8_segments(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& sfb,
                                           const at::Tensor& layout, int64_t num_groups, int64_t alignment,
                                           int64_t gran_k) {
  std::vector<Segment> segments = layout_segments(kKGroupedFp8, layout, true, alignment, a.size(0), num_groups);
  int64_t rows = 0;
  for (const Segment& s : segments) rows += (s.end - s.begin + gran_k - 1) / gran_k;
  for (const auto& [name, sf] : {std::pair{"sfa", &sfa}, std::pair{"sfb", &sfb}}) {
    AM_CHECK_ARG(sf->size(0) == rows, kKGroupedFp8, name, "size(0)",
                 std::to_string(rows) + " (sum over groups of ceil(k_g / gran_k))", sf->size(0));
  }
  return segments;
}

}  // namespace ascend_moe::grouped
