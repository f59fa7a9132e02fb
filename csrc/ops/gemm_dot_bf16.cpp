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
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

#include "gemm.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
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

#else

bool cpu_has_avx512_bf16() { return false; }

bool dot_bf16_fp32_into(at::Tensor&, const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                        double) {
  return false;
}

#endif

}  // namespace ascend_moe
