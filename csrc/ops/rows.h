// Row-wise element loops shared by the CPU kernels that work a chunk of rows at a time (swiglu, norm): BF16
// conversions as torch's, TileKernels' per-token E4M3 cast (quantize_blocks' rule), and the row chunking with
// per-thread scratch. The loops are built for AVX2 and baseline x86-64 (vector_clones.h); every step is one IEEE
// operation, so results are the torch-op compositions' bit for bit.
#pragma once

#include <ATen/Parallel.h>
#include <c10/core/ScalarType.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace ascend_moe {

constexpr float kE4M3Max = 448.0f;
// Elements of each buffer a chunk holds (FP32 buffers of a few hundred KiB stay in L2); a chunk is whole rows.
constexpr int64_t kChunkElements = int64_t{1} << 14;
// Elements a thread takes at least: smaller calls run on the caller's thread.
constexpr int64_t kWorkPerThread = int64_t{1} << 15;

inline uint32_t bits_of(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// BF16 bits -> FP32 (exact).
void bf16_row_to_float(const uint16_t* src, int64_t n, float* dst);
// FP32 -> BF16 bits, c10's round to nearest even; NaN -> 0x7FC0 (c10's scalar cast) or `nan` (kVectorCastNaN:
// what ATen's AVX2/AVX512 casts write in their vector lanes).
constexpr uint16_t kVectorCastNaN = 0xFFFF;
void float_row_to_bf16(const float* src, int64_t n, uint16_t* dst, uint16_t nan = 0x7FC0);

// y[j] = y[j] * b[j] (* w when weighted) for j < n, one pass, each FP32 product rounded in that order: the SwiGLU
// product and its routing weight (ATen's y.mul_(b).mul_(w) bits), shared by the grouped SwiGLU epilogue and
// mega_moe's CPU loops.
void times_up(float* y, const float* b, int64_t n, bool weighted, float w);

// acc[h] += w[j] * rows[j][h] (acc[h] += rows[j][h] where w is null) for j = 0..k-1 in order, each product and sum
// rounded (no FMA), for BF16 (bits) and FP32 rows: moe_unpermute's and the EP combine's slot-order sums.
void add_rows_bf16(float* acc, const uint16_t* const* rows, const float* w, int64_t k, int64_t n);
void add_rows_f32(float* acc, const float* const* rows, const float* w, int64_t k, int64_t n);

// The same for any row type T and sum type Acc: the vector loops above for BF16 and FP32 rows into FP32 sums, a
// plain loop otherwise (FP16 rows, FP64 sums).
template <typename T, typename Acc>
void add_rows(Acc* acc, const T* const* rows, const Acc* w, int64_t k, int64_t n) {
  if constexpr (std::is_same_v<Acc, float> && std::is_same_v<T, c10::BFloat16>) {
    add_rows_bf16(acc, reinterpret_cast<const uint16_t* const*>(rows), w, k, n);
  } else if constexpr (std::is_same_v<Acc, float> && std::is_same_v<T, float>) {
    add_rows_f32(acc, rows, w, k, n);
  } else {
    for (int64_t j = 0; j < k; ++j) {
      for (int64_t h = 0; h < n; ++h) acc[h] += w ? w[j] * static_cast<Acc>(rows[j][h]) : static_cast<Acc>(rows[j][h]);
    }
  }
}

// n sums rounded to T (BF16 through the vector loop, c10's rounding).
template <typename T, typename Acc>
void store_row(const Acc* acc, int64_t n, T* out) {
  if constexpr (std::is_same_v<Acc, float> && std::is_same_v<T, c10::BFloat16>) {
    float_row_to_bf16(acc, n, reinterpret_cast<uint16_t*>(out));
  } else {
    for (int64_t h = 0; h < n; ++h) out[h] = static_cast<T>(acc[h]);
  }
}

// TileKernels' per-token E4M3 cast of one row of `cols` FP32 values in blocks of `block`: amax (NaN wins) floored
// at `floor`, sf = amax / 448 (round_sf: rounded up to a power of two by adding the mantissa's all-ones, wrapping as
// torch's int32 add), multiplier 448 / amax (1 / sf with round_sf; 0 where sf is 0), codes
// e4m3(clamp(y * multiplier, -448, 448)) written as bytes to q, scales to sf.
void cast_row_e4m3(const float* y, int64_t cols, int64_t block, bool round_sf, float floor, uint8_t* q, float* sf);

// n values of dtype t (BF16, FP32 or FP64) at src into dst in the compute type (exact: a widening or the same type).
template <typename acc_t>
void load_values(c10::ScalarType t, const void* src, int64_t n, acc_t* dst) {
  if (t == c10::kBFloat16) {
    const uint16_t* p = static_cast<const uint16_t*>(src);
    if constexpr (std::is_same_v<acc_t, float>) {
      bf16_row_to_float(p, n, dst);
    } else {
      for (int64_t j = 0; j < n; ++j) dst[j] = float_of(static_cast<uint32_t>(p[j]) << 16);
    }
  } else if (t == c10::kFloat) {
    const float* p = static_cast<const float*>(src);
    for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<acc_t>(p[j]);
  } else {
    const double* p = static_cast<const double*>(src);
    for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<acc_t>(p[j]);
  }
}

// n values in the compute type into dtype t (BF16, FP32 or FP64) at dst: one rounding each, as .to(t).
template <typename acc_t>
void store_values(const acc_t* src, int64_t n, c10::ScalarType t, void* dst) {
  if (t == c10::kBFloat16) {
    uint16_t* p = static_cast<uint16_t*>(dst);
    if constexpr (std::is_same_v<acc_t, float>) {
      float_row_to_bf16(src, n, p);
    } else {
      for (int64_t j = 0; j < n; ++j) p[j] = c10::BFloat16(static_cast<float>(src[j])).x;
    }
  } else if (t == c10::kFloat) {
    float* p = static_cast<float*>(dst);
    for (int64_t j = 0; j < n; ++j) p[j] = static_cast<float>(src[j]);
  } else {
    double* p = static_cast<double*>(dst);
    for (int64_t j = 0; j < n; ++j) p[j] = static_cast<double>(src[j]);
  }
}

// A thread's scratch buffer, kept between chunks and calls (no allocation or zero-fill per chunk).
template <typename T>
T* scratch(std::vector<T>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(n);
  return v.data();
}

// body(r0, r1) over chunks of whole rows of width h (about kChunkElements elements each), parallel when the call is
// big enough. A row's result never depends on the chunking (the kernels work row by row, or call ATen's row sums).
template <typename F>
void for_row_chunks(int64_t rows, int64_t h, F&& body) {
  const int64_t per_chunk = std::max<int64_t>(1, kChunkElements / std::max<int64_t>(h, 1));
  const int64_t chunks = (rows + per_chunk - 1) / per_chunk;
  const int64_t grain = std::max<int64_t>(1, kWorkPerThread / (per_chunk * std::max<int64_t>(h, 1)));
  at::parallel_for(0, chunks, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) body(c * per_chunk, std::min(rows, (c + 1) * per_chunk));
  });
}

}  // namespace ascend_moe
