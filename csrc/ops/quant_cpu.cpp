// The quant family: schemas and CPU kernels of quantize_fp8, quantize_fp4 and dequantize, and the casts every
// op that quantizes inside shares (quant.h). Bit-identical to torch_ascend_moe/quant/reference.py, DeepGEMM's
// reference quantizers (specs/deepgemm_api.md §2.2, §12).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/where.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fp8_gemm.h"
#include "quant.h"
#include "quant_checks.h"

namespace ascend_moe {
namespace {

constexpr double kFp8Max = 448.0;
constexpr double kFp4Max = 6.0;
constexpr double kAmaxFloor = 1e-4;
constexpr uint8_t kUe8m0One = 127;  // the packed tail: scale 1.0
constexpr int64_t kChunkFloats = 65536;  // 256 KB of FP32 rows: a conversion buffer that stays in cache

using quant::ceil_div;

// The smallest power of two >= sf (exponent clamped to [1, 254]): a UE8M0-representable scale. A NaN
// scale (a block holding NaN) stays NaN (UE8M0 code 0xFF), as in quant.ceil_to_ue8m0.
at::Tensor ceil_to_ue8m0(const at::Tensor& sf) {
  const at::Tensor bits = sf.view(at::kInt);
  const at::Tensor exponent =
      bits.bitwise_right_shift(23).bitwise_and(0xFF) + bits.bitwise_and(0x7FFFFF).ne(0).to(at::kInt);
  return at::where(sf.isnan(), sf, exponent.clamp(1, 254).bitwise_left_shift(23).view(at::kFloat));
}

// Per-block amax of a row-major [R, C] matrix in gr x gc blocks, into amax [ceil(R/gr), ceil(C/gc)]
// (blocks past the edge cover only the rows/columns that exist, as zero padding would).
template <typename T>
void block_amax(const T* x, int64_t R, int64_t C, int64_t gr, int64_t gc, float* amax) {
  const int64_t rb = ceil_div(R, gr), cb = ceil_div(C, gc);
  at::parallel_for(0, rb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      float* out = amax + b * cb;
      std::fill(out, out + cb, 0.f);
      for (int64_t r = b * gr; r < std::min(R, (b + 1) * gr); ++r) {
        const T* row = x + r * C;
        if (gc == 1) {
          // One scale per column: a running max per column that a NaN, once seen, keeps.
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const float v = std::abs(static_cast<float>(row[c]));
            out[c] = (v > out[c] || v != v) ? v : out[c];
          }
          continue;
        }
        for (int64_t j = 0; j < cb; ++j) {
          const int64_t c0 = j * gc, c1 = std::min(C, c0 + gc);
          float m = out[j];
          int nan = static_cast<int>(m != m);  // a NaN from an earlier row of the block
          // std::max (and the max reduction) drop a NaN operand; counting NaNs apart keeps the loop a
          // vector max and makes a block holding NaN get a NaN amax (so scale), as torch.amax in the
          // reference cast does.
#pragma omp simd reduction(max : m) reduction(| : nan)
          for (int64_t c = c0; c < c1; ++c) {
            const float v = std::abs(static_cast<float>(row[c]));
            m = std::max(m, v);
            nan |= static_cast<int>(v != v);
          }
          out[j] = nan ? std::numeric_limits<float>::quiet_NaN() : m;
        }
      }
    }
  });
}

// out[c] = float(row[c]) * inv_row[c / gc]: the reference's multiply by the scale's reciprocal, in FP32.
template <typename T>
void scaled_row(const T* row, int64_t C, int64_t gc, const float* inv_row, float* out) {
  if (gc == 1) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) out[c] = static_cast<float>(row[c]) * inv_row[c];
    return;
  }
  for (int64_t c0 = 0, j = 0; c0 < C; c0 += gc, ++j) {
    const float f = inv_row[j];
    const int64_t c1 = std::min(C, c0 + gc);
#pragma omp simd
    for (int64_t c = c0; c < c1; ++c) out[c] = static_cast<float>(row[c]) * f;
  }
}

// DeepGEMM's E2M1 rounding: the code counts the midpoints |v| strictly exceeds; the sign only on nonzero codes
// (NaN compares false everywhere: code 0).
inline uint32_t e2m1_code(float v) {
  const float a = std::abs(v);
  const uint32_t code = static_cast<uint32_t>(a > 0.25f) + static_cast<uint32_t>(a > 0.75f) +
                        static_cast<uint32_t>(a > 1.25f) + static_cast<uint32_t>(a > 1.75f) +
                        static_cast<uint32_t>(a > 2.5f) + static_cast<uint32_t>(a > 3.5f) +
                        static_cast<uint32_t>(a > 5.0f);
  return code | ((static_cast<uint32_t>(v < 0.f) & static_cast<uint32_t>(code != 0)) << 3);
}

// Row-major x of a BF16/FP16/FP32/FP64 matrix, dispatched on its dtype.
template <typename F>
void dispatch_high_precision(const at::Tensor& x, F&& fn) {
  AT_DISPATCH_SWITCH(x.scalar_type(), "quantize",
                     AT_DISPATCH_CASE(at::kFloat, [&] { fn(x.const_data_ptr<scalar_t>()); })
                     AT_DISPATCH_CASE(at::kBFloat16, [&] { fn(x.const_data_ptr<scalar_t>()); })
                     AT_DISPATCH_CASE(at::kHalf, [&] { fn(x.const_data_ptr<scalar_t>()); })
                     AT_DISPATCH_CASE(at::kDouble, [&] { fn(x.const_data_ptr<scalar_t>()); }));
}

// (FP32 scales, their reciprocals) of x's blocks: amax floored at 1e-4 over the format's maximum, optionally
// rounded up to a power of two; the scale arithmetic runs as the same ATen ops as the reference, on the small
// scale tensor.
std::pair<at::Tensor, at::Tensor> block_scales(const at::Tensor& x, int64_t gr, int64_t gc, double fmt_max,
                                               bool ue8m0) {
  const int64_t R = x.size(0), C = x.size(1);
  at::Tensor amax = at::empty({ceil_div(R, gr), ceil_div(C, gc)}, x.options().dtype(at::kFloat));
  dispatch_high_precision(x, [&](const auto* data) { block_amax(data, R, C, gr, gc, amax.data_ptr<float>()); });
  at::Tensor sf = amax.clamp_min(kAmaxFloor).div(fmt_max);
  if (ue8m0) sf = ceil_to_ue8m0(sf);
  // Elementwise results of an empty tensor may carry odd strides; the fake's are row-major.
  if (sf.numel() == 0) sf = at::empty(sf.sizes(), sf.options());
  return {sf, sf.reciprocal().mul(1.0)};  // the reference multiplies by (1.0 / sf)
}

// out [R, C] = rows that fill(r0, r1, dst) writes in FP32 (row r0 at dst), chunk by chunk: straight into an FP32
// `out`, else through a cache-sized FP32 buffer and ATen's copy_, whose conversion (vectorized for the CPU at hand)
// is the one the reference's .to() runs.
template <typename F>
void rows_through_fp32(at::Tensor& out, F&& fill) {
  const int64_t R = out.size(0), C = out.size(1);
  if (R == 0 || C == 0) return;
  const int64_t chunk = std::max<int64_t>(1, kChunkFloats / C);
  at::parallel_for(0, R, chunk, [&](int64_t r0, int64_t r1) {
    if (out.scalar_type() == at::kFloat) {
      fill(r0, r1, out.data_ptr<float>() + r0 * C);
      return;
    }
    at::Tensor buf = at::empty({std::min(chunk, r1 - r0), C}, out.options().dtype(at::kFloat));
    for (int64_t a = r0; a < r1; a += chunk) {
      const int64_t b = std::min(r1, a + chunk);
      fill(a, b, buf.data_ptr<float>());
      out.narrow(0, a, b - a).copy_(buf.narrow(0, 0, b - a));
    }
  });
}

}  // namespace

std::pair<at::Tensor, at::Tensor> quantize_blocks(const at::Tensor& x_in, int64_t gr, int64_t gc, bool ue8m0) {
  const at::Tensor x = x_in.contiguous();
  const int64_t R = x.size(0), C = x.size(1), cb = ceil_div(C, gc);
  auto [sf, inv] = block_scales(x, gr, gc, kFp8Max, ue8m0);
  at::Tensor q = at::empty({R, C}, x.options().dtype(at::kFloat8_e4m3fn));
  const float* inv_p = inv.const_data_ptr<float>();
  // The E4M3 rounding is ATen's conversion (finite overflow saturates to 448, NaN stays NaN).
  dispatch_high_precision(x, [&](const auto* data) {
    rows_through_fp32(q, [&](int64_t r0, int64_t r1, float* dst) {
      for (int64_t r = r0; r < r1; ++r) scaled_row(data + r * C, C, gc, inv_p + (r / gr) * cb, dst + (r - r0) * C);
    });
  });
  return {q, sf};
}

std::pair<at::Tensor, at::Tensor> quantize_blocks_fp4(const at::Tensor& x_in, int64_t gr, int64_t gc, bool ue8m0) {
  const at::Tensor x = x_in.contiguous();
  const int64_t R = x.size(0), C = x.size(1), cb = ceil_div(C, gc);
  auto [sf, inv] = block_scales(x, gr, gc, kFp4Max, ue8m0);
  at::Tensor packed = at::empty({R, C / 2}, x.options().dtype(at::kByte));
  const float* inv_p = inv.const_data_ptr<float>();
  uint8_t* out = packed.data_ptr<uint8_t>();
  dispatch_high_precision(x, [&](const auto* data) {
    at::parallel_for(0, R, 16, [&](int64_t r0, int64_t r1) {
      std::vector<float> buf(C);
      for (int64_t r = r0; r < r1; ++r) {
        scaled_row(data + r * C, C, gc, inv_p + (r / gr) * cb, buf.data());
        uint8_t* row = out + r * (C / 2);
        const float* v = buf.data();
#pragma omp simd
        for (int64_t j = 0; j < C / 2; ++j) {
          row[j] = static_cast<uint8_t>(e2m1_code(v[2 * j]) | (e2m1_code(v[2 * j + 1]) << 4));
        }
      }
    });
  });
  return {packed, sf};
}

at::Tensor pack_ue8m0(const at::Tensor& sf_in) {
  const at::Tensor sf = sf_in.contiguous();
  const int64_t S = sf.size(0), n = sf.size(1), words = ceil_div(n, 4);
  at::Tensor packed = at::empty({S, words}, sf.options().dtype(at::kInt));
  const float* src = sf.const_data_ptr<float>();
  // Byte j of word i is scale 4i + j: the words' memory order on a little-endian host, as the reference's
  // uint8 -> int32 view.
  auto* dst = reinterpret_cast<uint8_t*>(packed.data_ptr<int32_t>());
  for (int64_t s = 0; s < S; ++s) {
    uint8_t* row = dst + s * words * 4;
    for (int64_t j = 0; j < words * 4; ++j) {
      if (j >= n) {
        row[j] = kUe8m0One;
        continue;
      }
      const float v = src[s * n + j];
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof(bits));
      row[j] = v != v ? 0xFF : static_cast<uint8_t>((bits >> 23) & 0xFF);
    }
  }
  return packed;
}

namespace {

std::tuple<at::Tensor, at::Tensor> quantize_fp8_cpu(const at::Tensor& x, at::IntArrayRef block, bool use_ue8m0,
                                                    bool use_packed_ue8m0) {
  quant::quantize_signature(quant::kQuantizeFp8, x, block, use_ue8m0, use_packed_ue8m0, false);
  auto [q, sf] = quantize_blocks(x, block[0], block[1], use_ue8m0);
  return {q, use_packed_ue8m0 ? pack_ue8m0(sf) : sf};
}

std::tuple<at::Tensor, at::Tensor> quantize_fp4_cpu(const at::Tensor& x, at::IntArrayRef block, bool use_ue8m0,
                                                    bool use_packed_ue8m0) {
  quant::quantize_signature(quant::kQuantizeFp4, x, block, use_ue8m0, use_packed_ue8m0, true);
  auto [q, sf] = quantize_blocks_fp4(x, block[0], block[1], use_ue8m0);
  return {q, use_packed_ue8m0 ? pack_ue8m0(sf) : sf};
}

// UE8M0 scales packed `per` to an integer word, FP32 [S, n]: code 255 NaN, 0 2^-127 (float8_e8m0fnu's values).
at::Tensor unpack_ue8m0(const at::Tensor& packed_in, int64_t n) {
  const at::Tensor packed = packed_in.contiguous();
  const int64_t S = packed.size(0), row_bytes = packed.size(1) * packed.element_size();
  at::Tensor out = at::empty({S, n}, packed.options().dtype(at::kFloat));
  const auto* src = static_cast<const uint8_t*>(packed.const_data_ptr());
  float* dst = out.data_ptr<float>();
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t j = 0; j < n; ++j) {
      dst[s * n + j] = static_cast<float>(c10::Float8_e8m0fnu(src[s * row_bytes + j], c10::Float8_e8m0fnu::from_bits()));
    }
  }
  return out;
}

at::Tensor dequantize_cpu(const at::Tensor& data, const at::Tensor& scale, at::IntArrayRef block,
                          std::optional<at::ScalarType> out_dtype) {
  quant::dequantize_signature(data, scale, block, out_dtype);
  const bool fp4 = data.scalar_type() == at::kByte;
  const int64_t per = quant::packed_per_word(scale.scalar_type());
  const int64_t M = data.size(0), N = fp4 ? 2 * data.size(1) : data.size(1);
  const int64_t gr = block[0], gc = block[1], cb = ceil_div(N, gc);
  const at::Tensor sf = per > 1 ? unpack_ue8m0(scale, cb) : scale.to(at::kFloat).contiguous();
  at::Tensor out = at::empty({M, N}, data.options().dtype(out_dtype.value_or(at::kFloat)));
  const at::Tensor bytes = data.view(at::kByte).contiguous();
  const uint8_t* src = bytes.const_data_ptr<uint8_t>();
  const float* sf_p = sf.const_data_ptr<float>();
  const int64_t row_bytes = fp4 ? N / 2 : N;
  // The FP32 product, rounded once to the output dtype by ATen's conversion (the reference's .to()).
  rows_through_fp32(out, [&](int64_t r0, int64_t r1, float* dst) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = dst + (r - r0) * N;
      decode_quantized_rows(src + r * row_bytes, 1, row_bytes, N, fp4, row);
      const float* s = sf_p + (r / gr) * cb;
      for (int64_t c0 = 0, j = 0; c0 < N; c0 += gc, ++j) {
        const float f = s[j];
        const int64_t c1 = std::min(N, c0 + gc);
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) row[c] *= f;
      }
    }
  });
  return out;
}

}  // namespace

// The quant family's schemas, a fragment of the ascend_moe library (the table in library.cpp is shared).
// Codes carry no gradient: the quantize ops' outputs are not differentiable (a gradient stored in FP8 would be
// rounded to 3 mantissa bits and flushed below 2^-9; FP4 codes are integers) and dequantize differentiates
// only its FP32 scale; quant.fake_quantize is the straight-through path.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  m.set_python_module("torch_ascend_moe.fakes.quant");
  // x [M, N] (BF16/FP16/FP32/FP64) in block = [rows, cols] blocks -> (E4M3 [M, N], scale): FP32
  // [ceil(M / rows), ceil(N / cols)], or with use_packed_ue8m0 (needs use_ue8m0) int32 [.., ceil(.. / 4)].
  // Per-token [1, g], per-channel [g, 1], per-block [g, g]; ragged blocks are zero-padded.
  m.def(
      "quantize_fp8(Tensor x, int[2] block=[1, 128], bool use_ue8m0=False, bool use_packed_ue8m0=False) "
      "-> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // The same blocks to E2M1: (uint8 [M, N / 2], two codes per byte, low nibble first; scale as above), N even.
  m.def(
      "quantize_fp4(Tensor x, int[2] block=[1, 128], bool use_ue8m0=False, bool use_packed_ue8m0=False) "
      "-> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // data (E4M3 [M, N] or packed FP4 uint8 [M, N / 2]) * scale (FP32, float8_e8m0fnu, or int32 / int16 packed
  // UE8M0) per block, in FP32, rounded once to out_dtype (default FP32).
  m.def("dequantize(Tensor data, Tensor scale, int[2] block=[1, 128], ScalarType? out_dtype=None) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  // TileKernels' cast (specs/tilekernels_deepselect.md §2): x [M, N] in block = [rows, cols] blocks to fmt
  // "e4m3" (E4M3 [M, N]), "e2m1" (uint8 [M, N / 2], low nibble first, round to nearest even, saturating at 6) or
  // "e5m6" (rows only, N % 8 == 0: 12-bit codes, 8 per 12 bytes, uint8 [M, 3N / 2]; TileKernels' rounding, no clamp)
  // -> (data, sf FP32 [ceil(M / rows), ceil(N / cols)], the dequantization scale): amax floored at amax_clamp
  // (default 1e-4 for E4M3 and E5M6, 6 * 2^-126 for E2M1), sf = amax / max; x times max / amax, or times 1 / sf
  // with round_sf (sf rounded up to a power of two) or a given sf (returned as is). Device-generic kernel.
  m.def(
      "quantize_blocks(Tensor x, str fmt, int[2] block, bool round_sf=False, Tensor? sf=None, "
      "float? amax_clamp=None) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("quantize_fp8", &quantize_fp8_cpu);
  m.impl("quantize_fp4", &quantize_fp4_cpu);
  m.impl("dequantize", &dequantize_cpu);
}

}  // namespace ascend_moe
