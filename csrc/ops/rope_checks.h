// The rope family's argument checks (rotary_embedding). Twin: torch_ascend_moe/checks/rope.py (the same checks in
// the same order, the same words; tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/aminmax.h>

#include <cstdint>
#include <optional>
#include <string>

#include "checks.h"

namespace ascend_moe::rope {

constexpr const char* kOp = "ascend_moe::rotary_embedding";

inline void rope_signature(const at::Tensor& x, const at::Tensor& cache, const std::optional<at::Tensor>& positions,
                           int64_t seqlen_offset) {
  AM_CHECK_ARG(x.dim() == 3 || x.dim() == 4, kOp, "x", "rank", "3-D [T, heads, rot] or 4-D [B, S, heads, rot]",
               std::to_string(x.dim()) + "-D");
  const at::ScalarType t = x.scalar_type();
  AM_CHECK_ARG(t == at::kBFloat16 || t == at::kFloat || t == at::kDouble, kOp, "x", "dtype",
               "torch.bfloat16, torch.float32 or torch.float64", dtype_name(t));
  check_rank(kOp, "cos_sin_cache", cache, 2, "[rows, rot] (cos halves, then sin halves)");
  const at::ScalarType want = t == at::kDouble ? at::kDouble : at::kFloat;
  AM_CHECK_ARG(cache.scalar_type() == want, kOp, "cos_sin_cache", "dtype", dtype_name(want),
               dtype_name(cache.scalar_type()));
  AM_CHECK_ARG(cache.device() == x.device(), kOp, "cos_sin_cache", "device", x.device().str() + " (same as 'x')",
               cache.device().str());
  const int64_t rot = cache.size(1);
  AM_CHECK_ARG(rot % 2 == 0 && rot > 0, kOp, "cos_sin_cache", "size(1)", "an even rotary dim > 0", rot);
  check_dim_size(kOp, "x", x, x.dim() - 1, "rot", rot, "cos_sin_cache.size(1)");
  check_int_arg(kOp, "seqlen_offset", seqlen_offset, 0);
  if (!positions.has_value()) {
    const int64_t need = seqlen_offset + x.size(-3);
    AM_CHECK_ARG(need <= cache.size(0), kOp, "cos_sin_cache", "size(0)",
                 "at least seqlen_offset + tokens = " + std::to_string(need), cache.size(0));
    return;
  }
  const at::Tensor& p = *positions;
  AM_CHECK_ARG(p.scalar_type() == at::kInt || p.scalar_type() == at::kLong, kOp, "positions", "dtype",
               "torch.int32 or torch.int64", dtype_name(p.scalar_type()));
  AM_CHECK_ARG(p.device() == x.device(), kOp, "positions", "device", x.device().str() + " (same as 'x')",
               p.device().str());
  const auto rows = x.sizes().slice(0, x.dim() - 2);
  AM_CHECK_ARG(p.sizes().equals(rows), kOp, "positions", "shape", shape_str(rows) + " (x's tokens)",
               shape_str(p.sizes()));
}

inline std::string int128_text(__int128 v) {
  if (v >= 0 && v <= INT64_MAX) return std::to_string(static_cast<int64_t>(v));
  const bool negative = v < 0;
  unsigned __int128 m = negative ? -static_cast<unsigned __int128>(v) : static_cast<unsigned __int128>(v);
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(m % 10)));
    m /= 10;
  } while (m != 0);
  return negative ? "-" + digits : digits;
}

// The cache rows a call reads exist (a kernel's check of values; after rope_signature).
inline void check_rows(const at::Tensor& x, const at::Tensor& cache, const std::optional<at::Tensor>& positions,
                       int64_t offset) {
  const int64_t limit = cache.size(0);
  if (!positions.has_value()) {
    const int64_t need = offset + x.size(-3);
    AM_CHECK_ARG(need <= limit, kOp, "cos_sin_cache", "size(0)",
                 "at least seqlen_offset + tokens = " + std::to_string(need), limit);
    return;
  }
  if (positions->numel()) {
    const auto [min, max] = at::aminmax(*positions);
    // The sums in 128 bits: a position near 2^63 plus the offset must be reported as the number it is (the fake's
    // Python ints do not wrap), not wrapped into a small or negative row.
    const __int128 lo = static_cast<__int128>(min.item<int64_t>()) + offset;
    const __int128 hi = static_cast<__int128>(max.item<int64_t>()) + offset;
    AM_CHECK_ARG(0 <= lo && hi < limit, kOp, "positions", "values",
                 "positions + seqlen_offset in [0, " + std::to_string(limit) + ")",
                 "[" + int128_text(lo) + ", " + int128_text(hi) + "]");
  }
}

}  // namespace ascend_moe::rope
