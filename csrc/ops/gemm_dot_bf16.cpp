// FP32 results of BF16 operands with the CPU's BF16 dot-product instruction (AVX512-BF16 VDPBF16PS): the grouped
// weight gradient's GEMMs. ATen has no BF16 -> FP32 GEMM on CPU, and MKL's (cblas_gemm_bf16bf16f32) took its
// generic path on an AVX512-BF16 AMD EPYC (198 ms for bench grouped's k-grouped case, against 163 ms converting
// to FP32 panels for SGEMM): this kernel multiplies the BF16 pairs natively. Compiled with a target attribute, so
// the file builds on any x86 compiler flags; called only where the CPU reports the instruction.
//
// Numerics: each BF16 product is exact in FP32 and VDPBF16PS adds the two products of a pair to the FP32
// accumulator one after the other, rounding to nearest even: an FP32 accumulation like the panel path's, in
// another order. The instruction flushes subnormal inputs and results to zero: callers take this path only when
// every product is normal (bf16_products_normal), as for ATen's BF16 GEMM.
#include <ATen/core/Tensor.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12's _mm512_shuffle_f32x4 and unpack intrinsics start from an undefined vector, which -Wuninitialized reports
// once per instantiation of the row kernel's lane tree (a false positive: every lane of the result is written).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define AM_DOT_BF16 1
#endif

namespace ascend_moe {

#if AM_DOT_BF16

namespace {

// Register tile: kMr rows of A (one broadcast pair each) by kNr columns of B (two 16-lane vectors of pairs).
constexpr int64_t kMr = 8, kNr = 32;
// Pairs of the reduction axis per pass over a tile: a B chunk (kNr x kKc pairs, 32 KB) stays in L1/L2 while every
// row panel passes over it.
constexpr int64_t kKc = 256;

// Packed operands: per panel, per pair of the reduction axis, the panel's rows' (k, k+1) BF16 pairs as 32-bit
// words (k+1 in the high half), zero beyond the operand.
struct Packed {
  std::vector<uint32_t> words;
  int64_t pairs = 0;
};

// rows x K operand t (element (i, k) at ptr[i * s0 + k * s1]) into panels of `width` rows.
Packed pack(const uint16_t* ptr, int64_t rows, int64_t k, int64_t s0, int64_t s1, int64_t width) {
  Packed p;
  p.pairs = (k + 1) / 2;
  const int64_t panels = (rows + width - 1) / width;
  p.words.assign(panels * p.pairs * width, 0);
  at::parallel_for(0, panels, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t q = lo; q < hi; ++q) {
      uint32_t* dst = p.words.data() + q * p.pairs * width;
      const int64_t n = std::min(width, rows - q * width);
      const uint16_t* base = ptr + q * width * s0;
      if (s0 == 1) {  // rows adjacent (a transposed operand: the weight gradient's): read along them
        for (int64_t kp = 0; kp < k / 2; ++kp) {
          const uint16_t* even = base + 2 * kp * s1;
          const uint16_t* odd = even + s1;
          for (int64_t i = 0; i < n; ++i) dst[kp * width + i] = even[i] | (static_cast<uint32_t>(odd[i]) << 16);
        }
        if (k % 2) {
          for (int64_t i = 0; i < n; ++i) dst[(k / 2) * width + i] = base[(k - 1) * s1 + i];
        }
        continue;
      }
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t* row = base + i * s0;
        for (int64_t kp = 0; kp < k / 2; ++kp) {
          dst[kp * width + i] = row[2 * kp * s1] | (static_cast<uint32_t>(row[(2 * kp + 1) * s1]) << 16);
        }
        if (k % 2) dst[(k / 2) * width + i] = row[(k - 1) * s1];
      }
    }
  });
  return p;
}

// c[kMr, kNr] (row stride ldc) = (accumulate ? c : 0) + A panel chunk . B panel chunk over `pairs` pairs.
__attribute__((target("avx512f,avx512bf16"))) void tile(const uint32_t* a, const uint32_t* b, int64_t pairs,
                                                         float* c, int64_t ldc, bool accumulate) {
  __m512 acc[kMr][2];
  for (int64_t i = 0; i < kMr; ++i) {
    acc[i][0] = accumulate ? _mm512_loadu_ps(c + i * ldc) : _mm512_setzero_ps();
    acc[i][1] = accumulate ? _mm512_loadu_ps(c + i * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + kp * kNr);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + kp * kNr + 16);
    for (int64_t i = 0; i < kMr; ++i) {
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[kp * kMr + i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], ai, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], ai, b1);
    }
  }
  for (int64_t i = 0; i < kMr; ++i) {
    _mm512_storeu_ps(c + i * ldc, acc[i][0]);
    _mm512_storeu_ps(c + i * ldc + 16, acc[i][1]);
  }
}

// ---- few rows against a K-major B: one dot product per (row, column), B read straight from memory ----
// The experts of a grouped GEMM with a few rows each (256 experts, 16 tokens each) multiply every weight by a few
// rows: the call is bound by reading the weights once. oneDNN packs each weight into its dot-product layout first
// (a write and a second read of it); here each 32-value chunk of a row of B meets the rows of A straight from
// memory, the pairs' products summed per lane by VDPBF16PS and the 16 lanes added at the end.

// Register tile: up to kRowsMr rows of A by kRowsNr rows of B, one accumulator each.
constexpr int kRowsMr = 4, kRowsNr = 4;

// Column groups (kRowsNr rows of B) ahead whose rows are prefetched into L2 while a group is multiplied. Four rows of
// 2 KiB read side by side are too short a stream for the hardware prefetcher: a 256-expert call read its weights
// at 9 GB/s, and at 21 GB/s (this core's sequential read) with the next-but-one group requested ahead, spread over
// the group's tiles (measured on an AVX512-BF16 EPYC: prefetches into L1 or one group ahead reached 15 GB/s).
constexpr int64_t kRowsPrefetchGroups = 2;

// The cache lines of a group of B rows (`rows` rows of `bytes` bytes, `stride` bytes apart), requested a few per
// k-step of the tiles that multiply an earlier group.
struct PrefetchCursor {
  const char* row = nullptr;
  int64_t offset = 0, bytes = 0, stride = 0, rows = 0;

  inline void next() {
    if (rows == 0) return;
    _mm_prefetch(row + offset, _MM_HINT_T1);
    offset += 64;
    if (offset >= bytes) {
      offset = 0;
      row += stride;
      --rows;
    }
  }
};

// sums[m * 4 + n] = sum over k of a[m, k] * b[n, k] for m < MR, n < NR (a row m at a + m * lda, b row n at
// b + n * ldb, unit stride along k). Lane l of an accumulator holds the pairs k = 32 s + 2 l, 32 s + 2 l + 1; the
// lanes are added by one fixed tree whatever MR and NR (absent accumulators are zero), so an output's bits depend
// on its own row of A and row of B only: not on the tile, the block or the thread that computed it.
template <int MR, int NR>
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void rows_tile(const uint16_t* a, int64_t lda,
                                                                     const uint16_t* b, int64_t ldb, int64_t K,
                                                                     float* sums, PrefetchCursor& ahead,
                                                                     int64_t prefetches) {
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {
    for (int64_t i = 0; i < prefetches; ++i) ahead.next();
    __m512bh bv[NR];
    for (int n = 0; n < NR; ++n) bv[n] = (__m512bh)_mm512_loadu_si512(b + n * ldb + k);
    for (int m = 0; m < MR; ++m) {
      const __m512bh av = (__m512bh)_mm512_loadu_si512(a + m * lda + k);
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], av, bv[n]);
    }
  }
  if (k < K) {  // the last K % 32 values; both operands read as zero beyond K, so the padding adds exact zeros
    const __mmask32 mask = static_cast<__mmask32>((uint64_t{1} << (K - k)) - 1);
    __m512bh bv[NR];
    for (int n = 0; n < NR; ++n) bv[n] = (__m512bh)_mm512_maskz_loadu_epi16(mask, b + n * ldb + k);
    for (int m = 0; m < MR; ++m) {
      const __m512bh av = (__m512bh)_mm512_maskz_loadu_epi16(mask, a + m * lda + k);
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_dpbf16_ps(acc[m][n], av, bv[n]);
    }
  }
  // 16 accumulators to 16 sums: halves, then quarters, then pairs and single lanes of each accumulator added. With
  // accumulator (m, n) as v[n * 4 + m], lane m * 4 + n of the result is its sum (row-major in the tile).
  __m512 v[16];
  for (int i = 0; i < 16; ++i) v[i] = _mm512_setzero_ps();
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) v[n * 4 + m] = acc[m][n];
  __m512 r[8], s[4], t[2];
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                         _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
  }
  for (int i = 0; i < 4; ++i) {
    s[i] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(r[2 * i], r[2 * i + 1], 0xDD));
  }
  for (int i = 0; i < 2; ++i) {
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(s[2 * i], s[2 * i + 1]), _mm512_unpackhi_ps(s[2 * i], s[2 * i + 1]));
  }
  const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(t[0]), _mm512_castps_pd(t[1]));
  const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(t[0]), _mm512_castps_pd(t[1]));
  _mm512_storeu_ps(sums, _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi)));
}

using RowsTile = void (*)(const uint16_t*, int64_t, const uint16_t*, int64_t, int64_t, float*, PrefetchCursor&,
                          int64_t);

template <int MR, int... NR>
constexpr std::array<RowsTile, sizeof...(NR)> rows_tiles_of(std::integer_sequence<int, NR...>) {
  return {&rows_tile<MR, NR + 1>...};
}

// kRowsTiles[MR - 1][NR - 1]: every edge shape.
template <int... MR>
constexpr std::array<std::array<RowsTile, kRowsNr>, sizeof...(MR)> rows_tiles(std::integer_sequence<int, MR...>) {
  return {rows_tiles_of<MR + 1>(std::make_integer_sequence<int, kRowsNr>())...};
}
constexpr auto kRowsTiles = rows_tiles(std::make_integer_sequence<int, kRowsMr>());

template <typename T>
void rows_block(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                double alpha, int64_t j0, int64_t w) {
  const int64_t M = a.size(0), K = a.size(1), lda = a.stride(0), ldb = b.stride(0);
  const auto* ap = reinterpret_cast<const uint16_t*>(a.const_data_ptr<at::BFloat16>());
  const auto* bp = reinterpret_cast<const uint16_t*>(b.const_data_ptr<at::BFloat16>()) + j0 * ldb;
  T* op = out.mutable_data_ptr<T>() + j0 * out.stride(1);
  const int64_t ldo = out.stride(0), so = out.stride(1);
  const T* cp = c.has_value() ? c->const_data_ptr<T>() + j0 * c->stride(1) : nullptr;
  const int64_t ldc = c.has_value() ? c->stride(0) : 0, sc = c.has_value() ? c->stride(1) : 0;
  const float scale = static_cast<float>(alpha);
  alignas(64) float sums[16];
  // A group's lines spread over its tiles' k-steps: ceil(lines / steps) per step.
  const int64_t row_bytes = K * 2, lines = kRowsNr * ((row_bytes + 63) / 64);
  const int64_t steps = ((M + kRowsMr - 1) / kRowsMr) * std::max<int64_t>(K / 32, 1);
  const int64_t prefetches = (lines + steps - 1) / steps, N = b.size(0);
  for (int64_t n0 = 0; n0 < w; n0 += kRowsNr) {
    const int64_t nr = std::min<int64_t>(kRowsNr, w - n0);
    const int64_t target = j0 + n0 + kRowsPrefetchGroups * kRowsNr;  // the first row of the group requested ahead
    PrefetchCursor ahead;
    if (target < N) {
      ahead = {reinterpret_cast<const char*>(bp + (n0 + kRowsPrefetchGroups * kRowsNr) * ldb), 0, row_bytes,
               ldb * 2, std::min<int64_t>(kRowsNr, N - target)};
    }
    for (int64_t m0 = 0; m0 < M; m0 += kRowsMr) {
      const int64_t mr = std::min<int64_t>(kRowsMr, M - m0);
      kRowsTiles[mr - 1][nr - 1](ap + m0 * lda, lda, bp + n0 * ldb, ldb, K, sums, ahead, prefetches);
      // alpha * sum (+ c) in FP32, one rounding into the output dtype: the contract of every GEMM path.
      for (int64_t i = 0; i < mr; ++i) {
        for (int64_t j = 0; j < nr; ++j) {
          float value = alpha == 1.0 ? sums[i * 4 + j] : sums[i * 4 + j] * scale;
          if (cp != nullptr) value += static_cast<float>(cp[(m0 + i) * ldc + (n0 + j) * sc]);
          op[(m0 + i) * ldo + (n0 + j) * so] = static_cast<T>(value);
        }
      }
    }
  }
}

}  // namespace

bool cpu_has_avx512_bf16() {
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") != 0;
  }();
  return has;
}

bool dot_bf16_fp32_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                        const std::optional<at::Tensor>& c, double alpha) {
  if (!cpu_has_avx512_bf16() || alpha != 1.0 || a.scalar_type() != at::kBFloat16 ||
      b.scalar_type() != at::kBFloat16 || out.scalar_type() != at::kFloat || out.stride(1) != 1) {
    return false;
  }
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  if (c.has_value() && !c->is_same(out)) out.copy_(*c);
  const bool prior = c.has_value();
  const Packed pa = pack(reinterpret_cast<const uint16_t*>(a.const_data_ptr<at::BFloat16>()), M, K, a.stride(0),
                         a.stride(1), kMr);
  const Packed pb = pack(reinterpret_cast<const uint16_t*>(b.const_data_ptr<at::BFloat16>()), N, K, b.stride(0),
                         b.stride(1), kNr);
  const int64_t pairs = pa.pairs, row_panels = (M + kMr - 1) / kMr, col_panels = (N + kNr - 1) / kNr;
  float* o = out.mutable_data_ptr<float>();
  const int64_t ldo = out.stride(0);
  // Tasks own column panels (each B chunk packed once, read by every row panel from cache); row panels inner.
  at::parallel_for(0, col_panels, 1, [&](int64_t q0, int64_t q1) {
    float edge[kMr * kNr] = {};
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t n0 = q * kNr, cols = std::min(kNr, N - n0);
      for (int64_t k0 = 0; k0 < pairs; k0 += kKc) {
        const int64_t chunk = std::min(kKc, pairs - k0);
        const bool accumulate = prior || k0 > 0;
        const uint32_t* bp = pb.words.data() + (q * pairs + k0) * kNr;
        for (int64_t p = 0; p < row_panels; ++p) {
          const int64_t m0 = p * kMr, rows = std::min(kMr, M - m0);
          const uint32_t* ap = pa.words.data() + (p * pairs + k0) * kMr;
          float* dst = o + m0 * ldo + n0;
          if (rows == kMr && cols == kNr) {
            tile(ap, bp, chunk, dst, ldo, accumulate);
            continue;
          }
          // An edge tile: through a full-size buffer, only its rows and columns read and written.
          if (accumulate) {
            for (int64_t i = 0; i < rows; ++i) std::memcpy(edge + i * kNr, dst + i * ldo, cols * sizeof(float));
          }
          tile(ap, bp, chunk, edge, kNr, accumulate);
          for (int64_t i = 0; i < rows; ++i) std::memcpy(dst + i * ldo, edge + i * kNr, cols * sizeof(float));
        }
      }
    }
  });
  return true;
}

bool dot_bf16_rows_takes(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                         const std::optional<at::Tensor>& c) {
  const at::ScalarType out_t = out.scalar_type();
  return cpu_has_avx512_bf16() && a.scalar_type() == at::kBFloat16 && b.scalar_type() == at::kBFloat16 &&
         (out_t == at::kBFloat16 || out_t == at::kFloat) && (!c.has_value() || c->scalar_type() == out_t) &&
         (a.stride(1) == 1 || a.size(1) <= 1) && (b.stride(1) == 1 || b.size(1) <= 1);
}

void dot_bf16_rows_block_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                              const std::optional<at::Tensor>& c, double alpha, int64_t j0, int64_t w) {
  if (out.scalar_type() == at::kFloat) {
    rows_block<float>(out, a, b, c, alpha, j0, w);
  } else {
    rows_block<at::BFloat16>(out, a, b, c, alpha, j0, w);
  }
}

#else

bool cpu_has_avx512_bf16() { return false; }

bool dot_bf16_fp32_into(at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                        double) {
  return false;
}

bool dot_bf16_rows_takes(const at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&) {
  return false;
}

void dot_bf16_rows_block_into(at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                              double, int64_t, int64_t) {}

#endif

}  // namespace ascend_moe
