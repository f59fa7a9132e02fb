// The rope family: rotary position embedding as TileKernels' Ascend-era transform.apply_rotary computes it
// (specs/tilekernels_deepselect.md §10.5), functional (the compat function writes the result back in place). Schema,
// and the CPU kernel: per token its cache row read in place, per head and pair two rounded products and one add or
// subtract, one rounding to x's dtype, where the device-generic kernel (torch_ascend_moe/backends/portable/rope.py)
// gathers the cache rows into a copy and makes several passes. The same operations in the same order: bit for bit
// the portable kernel (no FMA contraction, see the pragma below).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "rope_checks.h"
#include "rows.h"
#include "vector_clones.h"

// x1 * cos - x2 * sin rounds both products before the difference, as the portable kernel's separate ops: a compiler
// must not fuse a product into an FMA (the AVX2 clones have FMA instructions).
#pragma GCC optimize("fp-contract=off")

namespace ascend_moe {
namespace {

// Each token's cache row (positions + seqlen_offset, or the token's index in its sequence + seqlen_offset), after
// the value check (rope::check_rows): every row read exists.
std::vector<int64_t> cache_rows(const at::Tensor& x, const std::optional<at::Tensor>& positions, int64_t offset) {
  int64_t tokens = 1;
  for (int64_t d = 0; d < x.dim() - 2; ++d) tokens *= x.size(d);
  const int64_t seq = std::max<int64_t>(x.size(-3), 1);
  std::vector<int64_t> rows(tokens);
  if (!positions.has_value()) {
    for (int64_t t = 0; t < tokens; ++t) rows[t] = t % seq + offset;
    return rows;
  }
  const at::Tensor p = positions->to(at::kLong).contiguous();
  const int64_t* v = p.const_data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t) rows[t] = v[t] + offset;
  return rows;
}

// ---- element loops ----

// y = (x1 cos - x2 sin, x1 sin + x2 cos) for `half` pairs; x1[i] = x[i * step], x2[i] = x[i * step + gap], the same
// for y (NeoX halves: step 1, gap half; GPT-J neighbours: step 2, gap 1).
template <typename T>
inline void rotate_impl(const T* x, int64_t half, int64_t step, int64_t gap, const T* cos, const T* sin, T* y) {
  for (int64_t i = 0; i < half; ++i) {
    const T x1 = x[i * step], x2 = x[i * step + gap];
    const T a = x1 * cos[i], b = x2 * sin[i];
    const T c = x1 * sin[i], d = x2 * cos[i];
    y[i * step] = a - b;
    y[i * step + gap] = c + d;
  }
}
AM_VECTOR_CLONES void rotate_halves(const float* x, int64_t half, const float* cos, const float* sin, float* y) {
  rotate_impl(x, half, 1, half, cos, sin, y);
}
AM_VECTOR_CLONES void rotate_neighbours(const float* x, int64_t half, const float* cos, const float* sin, float* y) {
  rotate_impl(x, half, 2, 1, cos, sin, y);
}
void rotate_halves(const double* x, int64_t half, const double* cos, const double* sin, double* y) {
  rotate_impl(x, half, 1, half, cos, sin, y);
}
void rotate_neighbours(const double* x, int64_t half, const double* cos, const double* sin, double* y) {
  rotate_impl(x, half, 2, 1, cos, sin, y);
}

template <typename acc_t, typename x_t>
void rotate_tokens(const at::Tensor& x, const at::Tensor& cache, const std::vector<int64_t>& rows, bool interleaved,
                   bool conjugate, at::Tensor& out) {
  const int64_t rot = x.size(-1), heads = x.size(-2), half = rot / 2, tokens = static_cast<int64_t>(rows.size());
  const x_t* src = x.const_data_ptr<x_t>();
  x_t* dst = out.data_ptr<x_t>();
  const acc_t* table = cache.const_data_ptr<acc_t>();
  const int64_t grain = std::max<int64_t>(1, kWorkPerThread / std::max<int64_t>(heads * rot, 1));
  at::parallel_for(0, tokens, grain, [&](int64_t t0, int64_t t1) {
    thread_local std::vector<acc_t> buffer;
    acc_t* xs = scratch(buffer, 2 * rot + half);
    acc_t *ys = xs + rot, *neg_sin = ys + rot;
    for (int64_t t = t0; t < t1; ++t) {
      const acc_t* cos = table + rows[t] * rot;
      const acc_t* sin = cos + half;
      if (conjugate) {  // the inverse rotation: sin negated (exactly), as the portable kernel
        for (int64_t i = 0; i < half; ++i) neg_sin[i] = -sin[i];
        sin = neg_sin;
      }
      for (int64_t hd = 0; hd < heads; ++hd) {
        const int64_t base = (t * heads + hd) * rot;
        const acc_t* xr;
        acc_t* yr;
        if constexpr (std::is_same_v<x_t, acc_t>) {
          xr = reinterpret_cast<const acc_t*>(src + base);
          yr = reinterpret_cast<acc_t*>(dst + base);
        } else {  // BF16 rows through FP32 buffers
          bf16_row_to_float(reinterpret_cast<const uint16_t*>(src + base), rot, xs);
          xr = xs;
          yr = ys;
        }
        if (interleaved) {
          rotate_neighbours(xr, half, cos, sin, yr);
        } else {
          rotate_halves(xr, half, cos, sin, yr);
        }
        if constexpr (!std::is_same_v<x_t, acc_t>) float_row_to_bf16(ys, rot, reinterpret_cast<uint16_t*>(dst + base));
      }
    }
  });
}

at::Tensor rotary_embedding_cpu(const at::Tensor& x_in, const at::Tensor& cache_in,
                                const std::optional<at::Tensor>& positions, int64_t seqlen_offset, bool interleaved,
                                bool conjugate) {
  rope::rope_signature(x_in, cache_in, positions, seqlen_offset);
  rope::check_rows(x_in, cache_in, positions, seqlen_offset);
  const std::vector<int64_t> rows = cache_rows(x_in, positions, seqlen_offset);
  const at::Tensor x = x_in.contiguous(), cache = cache_in.contiguous();
  at::Tensor out = at::empty(x_in.sizes(), x_in.options());
  switch (x.scalar_type()) {
    case at::kBFloat16:
      rotate_tokens<float, c10::BFloat16>(x, cache, rows, interleaved, conjugate, out);
      break;
    case at::kFloat:
      rotate_tokens<float, float>(x, cache, rows, interleaved, conjugate, out);
      break;
    default:
      rotate_tokens<double, double>(x, cache, rows, interleaved, conjugate, out);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- rope family: per pair (x1, x2): (x1 cos - x2 sin, x1 sin + x2 cos) ----
  m.set_python_module("torch_ascend_moe.fakes.rope");
  // x [T, heads, rot] or [B, S, heads, rot] (BF16/FP32, FP64 for gradcheck); cos_sin_cache [rows, rot] FP32 (FP64
  // with FP64 x): cos in [:, :rot/2], sin in [:, rot/2:]. Row of token t: positions[t] (or [b, s]) + seqlen_offset,
  // else seqlen_offset + t (the token's index in its sequence). Pairs: NeoX halves (x[i], x[i + rot/2]), or GPT-J
  // neighbours (x[2i], x[2i+1]) with interleaved; conjugate negates sin (the inverse rotation). Computed in FP32
  // (FP64 for FP64 x), two rounded products and one add or subtract per result, rounded once to x's dtype.
  m.def(
      "rotary_embedding(Tensor x, Tensor cos_sin_cache, Tensor? positions=None, int seqlen_offset=0, "
      "bool interleaved=False, bool conjugate=False) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) { m.impl("rotary_embedding", &rotary_embedding_cpu); }

}  // namespace ascend_moe
