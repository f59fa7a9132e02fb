// Row-wise element loops shared by the swiglu and norm CPU kernels (declared in rows.h).
#include "rows.h"

#include <algorithm>
#include <cstdint>

#include "vector_clones.h"

// Every step one IEEE operation (rows.h): the AVX2 clones have FMA instructions, which GCC would fuse a product and
// a sum into (C++ contracts by default, under -std=c++20 too).
#pragma GCC optimize("fp-contract=off")

namespace ascend_moe {

// Sixteen columns' sums (one AVX-512 register, two AVX2 ones) stay put while every row is added, so each element of
// acc is stored once, not once per row. Measured on moe_unpermute (T4096 k8 H2048 BF16, 2 threads): 17-19 ms row by
// row over the acc buffer, 7.5 ms with eight columns (AVX2 EPYC, 2026-12-04; Inductor's code for the same sums: 7.1
// ms; 32 columns spilled: 21 ms). Each sum is its own chain of adds, so the lane count cannot change a bit: an
// AVX-512 clone too, with sixteen (AVX512-BF16 EPYC, 2026-12-07: 0.87-0.93x -> 1.03-1.11x Inductor's AVX-512 code
// at 1 and 2 threads; the AVX2 clone reads the same with 8 or 16 columns there).
constexpr int64_t kRowBlock = 16;

// The loop written out per row type and per form (with and without weights): with the form chosen inside, or the
// body shared through a template, GCC left the block's columns scalar (4x slower).
#define AM_ADD_ROWS(NAME, T, LOAD, TERM)                                                                     \
  AM_VECTOR_CLONES_WIDE void NAME(float* acc, const T* const* rows, const float* w, int64_t k, int64_t n) {  \
    int64_t h0 = 0;                                                                                          \
    for (; h0 + kRowBlock <= n; h0 += kRowBlock) {                                                           \
      float a[kRowBlock];                                                                                    \
      for (int64_t h = 0; h < kRowBlock; ++h) a[h] = acc[h0 + h];                                            \
      for (int64_t j = 0; j < k; ++j) {                                                                      \
        const T* row = rows[j] + h0;                                                                         \
        for (int64_t h = 0; h < kRowBlock; ++h) a[h] += TERM(LOAD(row[h]));                                  \
      }                                                                                                      \
      for (int64_t h = 0; h < kRowBlock; ++h) acc[h0 + h] = a[h];                                            \
    }                                                                                                        \
    for (int64_t j = 0; j < k; ++j) {                                                                        \
      for (int64_t h = h0; h < n; ++h) acc[h] += TERM(LOAD(rows[j][h]));                                     \
    }                                                                                                        \
  }
#define AM_BF16(b) float_of(static_cast<uint32_t>(b) << 16)
#define AM_F32(v) (v)
#define AM_WEIGHTED(x) (w[j] * (x))
#define AM_PLAIN(x) (x)
namespace {
AM_ADD_ROWS(add_weighted_bf16, uint16_t, AM_BF16, AM_WEIGHTED)
AM_ADD_ROWS(add_plain_bf16, uint16_t, AM_BF16, AM_PLAIN)
AM_ADD_ROWS(add_weighted_f32, float, AM_F32, AM_WEIGHTED)
AM_ADD_ROWS(add_plain_f32, float, AM_F32, AM_PLAIN)
}  // namespace
#undef AM_ADD_ROWS
#undef AM_BF16
#undef AM_F32
#undef AM_WEIGHTED
#undef AM_PLAIN

void add_rows_bf16(float* acc, const uint16_t* const* rows, const float* w, int64_t k, int64_t n) {
  w ? add_weighted_bf16(acc, rows, w, k, n) : add_plain_bf16(acc, rows, w, k, n);
}
void add_rows_f32(float* acc, const float* const* rows, const float* w, int64_t k, int64_t n) {
  w ? add_weighted_f32(acc, rows, w, k, n) : add_plain_f32(acc, rows, w, k, n);
}

AM_VECTOR_CLONES void times_up(float* y, const float* b, int64_t n, bool weighted, float w) {
  if (!weighted) {
    for (int64_t j = 0; j < n; ++j) y[j] = y[j] * b[j];
    return;
  }
  for (int64_t j = 0; j < n; ++j) y[j] = (y[j] * b[j]) * w;
}

AM_VECTOR_CLONES void bf16_row_to_float(const uint16_t* src, int64_t n, float* dst) {
  for (int64_t j = 0; j < n; ++j) dst[j] = float_of(static_cast<uint32_t>(src[j]) << 16);
}

// c10's round to nearest even (NaN -> `nan`), branch-free so it vectorizes.
AM_VECTOR_CLONES void float_row_to_bf16(const float* src, int64_t n, uint16_t* dst, uint16_t nan) {
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t u = bits_of(src[j]);
    const uint16_t rounded = static_cast<uint16_t>((u + (((u >> 16) & 1u) + 0x7FFFu)) >> 16);
    dst[j] = src[j] != src[j] ? nan : rounded;
  }
}

namespace {

// The largest |y| of a block as bits (non-negative floats order as their bits; NaN's above inf's), integer max.
AM_VECTOR_CLONES uint32_t abs_max_bits(const float* y, int64_t n) {
  uint32_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t u = bits_of(y[j]) & 0x7FFFFFFFu;
    m = u > m ? u : m;
  }
  return m;
}

// E4M3 codes of clamp(y * multiplier, -448, 448): c10's conversion (round to nearest even; NaN -> 0x7F with the
// sign) written branch-free so it vectorizes.
AM_VECTOR_CLONES void e4m3_codes(const float* y, int64_t n, float multiplier, uint8_t* q) {
  constexpr uint32_t kDenormMask = UINT32_C(141) << 23;
  for (int64_t j = 0; j < n; ++j) {
    float v = y[j] * multiplier;
    v = v > kE4M3Max ? kE4M3Max : (v < -kE4M3Max ? -kE4M3Max : v);
    const uint32_t u = bits_of(v);
    const uint32_t sign = u & 0x80000000u, mag = u ^ sign;
    const uint32_t denorm = bits_of(float_of(mag) + float_of(kDenormMask)) - kDenormMask;
    const uint32_t normal = (mag + ((static_cast<uint32_t>(7 - 127) << 23) + 0x7FFFFu) + ((mag >> 20) & 1u)) >> 20;
    const uint32_t code = mag >= (UINT32_C(1087) << 20) ? 0x7Fu : (mag < (UINT32_C(121) << 23) ? denorm : normal);
    q[j] = static_cast<uint8_t>(code | (sign >> 24));
  }
}

}  // namespace

void cast_row_e4m3(const float* y, int64_t cols, int64_t block, bool round_sf, float floor, uint8_t* q, float* sf) {
  for (int64_t j0 = 0, k = 0; j0 < cols; j0 += block, ++k) {
    const int64_t n = std::min(cols, j0 + block) - j0;
    float amax = float_of(abs_max_bits(y + j0, n));  // a NaN amax stays NaN through the floor (torch.clamp)
    amax = amax < floor ? floor : amax;
    float s = amax / kE4M3Max, multiplier;
    if (round_sf) {
      s = float_of((bits_of(s) + 0x007FFFFFu) & 0x7F800000u);
      multiplier = s == 0.0f ? 0.0f : 1.0f / s;
    } else {
      multiplier = s == 0.0f ? 0.0f : kE4M3Max / amax;
    }
    sf[k] = s;
    e4m3_codes(y + j0, n, multiplier, q + j0);
  }
}

}  // namespace ascend_moe
