// CPU kernel of the fp8_gemm family: block-scaled FP8/FP4 GEMM.
//
// Up to 8 rows of A (decode) a streaming kernel reads the quantized B once and decodes it in registers.
// Otherwise B (the weight, usually the larger operand) is dequantized panel by panel into FP32 and
// multiplied with MKL's SGEMM; A is dequantized once when small, else per row panel too. No full FP32
// copy of a large operand is made, and the product accumulates in FP32 with one final rounding.
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isfinite.h>
#include <ATen/Parallel.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <functional>
#include <tuple>
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "vector_clones.h"
#include "fp8_gemm.h"
#include "tasks.h"

namespace ascend_moe {

namespace {

constexpr int64_t kWholeAElements = int64_t{1} << 22;   // dequantize A at once below this size

// ---- streaming kernel for few rows of A (decode): reads the quantized B once, decodes in registers ----

constexpr int64_t kStreamingMaxRows = 8;

inline float from_bits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t from_bits_u(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

// Select without a branch (a ternary blocks GCC's vectorizer here): a where mask is all ones, else b.
inline uint32_t select_bits(bool take_a, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(take_a);
  return (a & mask) | (b & ~mask);
}

// E4M3 (bias 7, subnormals mant * 2^-9). 0x7F/0xFF are NaN (the quantizers write them for NaN input, and
// NaN must reach the output as PyTorch's float8 casts have it), not 480.
inline float e4m3_to_float(uint32_t v) {
  const uint32_t sign = (v & 0x80u) << 24, exp = (v >> 3) & 0xFu, mant = v & 7u;
  const uint32_t normal = sign | ((exp + 120u) << 23) | (mant << 20);
  const uint32_t sub = sign | from_bits_u(static_cast<float>(static_cast<int32_t>(mant)) * 0.001953125f);
  const uint32_t value = select_bits(exp != 0, normal, sub);
  return from_bits(select_bits((v & 0x7Fu) == 0x7Fu, sign | 0x7FC00000u, value));
}

// E2M1 code (low 4 bits): 0, 0.5, 1, 1.5, 2, 3, 4, 6 with bit 3 the sign.
inline float e2m1_to_float(uint32_t code) {
  const uint32_t sign = (code & 8u) << 28, exp = (code >> 1) & 3u, mant = code & 1u;
  const uint32_t normal = sign | ((exp + 126u) << 23) | (mant << 22);
  const uint32_t sub = sign | (mant * 0x3F000000u);  // +-0.5 or +-0
  return from_bits(select_bits(exp != 0, normal, sub));
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define AM_HAVE_F16C_PATH 1
// E4M3 -> FP32 through the F16C unit: moving the sign to bit 15 and the 7 exponent/mantissa bits to bits
// 7..13 gives an FP16 whose value is the E4M3 value * 2^-8 (biases 15 vs 7), subnormals included; one
// vcvtph2ps and a multiply by 256 finish it. About twice as fast as the bit-twiddling decoder. The NaN
// codes (magnitude 0x7F) would land on a finite FP16 (480 / 256): a compare and blend put an FP16 NaN there.
__attribute__((target("avx2,fma,f16c"))) void decode_e4m3_f16c(const uint8_t* src, int64_t n, float* out) {
  const __m128i sign_mask = _mm_set1_epi16(static_cast<short>(0x8000));
  const __m128i magnitude_mask = _mm_set1_epi16(0x7F);
  const __m128i half_nan = _mm_set1_epi16(0x7E00);
  const __m256 two_pow_8 = _mm256_set1_ps(256.f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + i)));
    const __m128i magnitude = _mm_and_si128(w, magnitude_mask);
    const __m128i is_nan = _mm_cmpeq_epi16(magnitude, magnitude_mask);
    const __m128i half = _mm_blendv_epi8(_mm_slli_epi16(magnitude, 7), half_nan, is_nan);
    const __m128i signed_half = _mm_or_si128(_mm_and_si128(_mm_slli_epi16(w, 8), sign_mask), half);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_cvtph_ps(signed_half), two_pow_8));
  }
  for (; i < n; ++i) out[i] = e4m3_to_float(src[i]);
}

bool has_f16c_path() {
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
                         __builtin_cpu_supports("fma");
  return ok;
}
#endif

// Decodes one K block (gk values) of a quantized row into FP32.
inline void decode_block(const uint8_t* row, int64_t k0, int64_t gk, bool fp4, float* out) {
#ifdef AM_HAVE_F16C_PATH
  if (!fp4 && has_f16c_path()) {
    decode_e4m3_f16c(row + k0, gk, out);
    return;
  }
#endif
  if (fp4) {
    const uint8_t* bytes = row + k0 / 2;
#pragma omp simd
    for (int64_t j = 0; j < gk / 2; ++j) {
      out[2 * j] = e2m1_to_float(bytes[j] & 0xFu);
      out[2 * j + 1] = e2m1_to_float(static_cast<uint32_t>(bytes[j]) >> 4);
    }
  } else {
#pragma omp simd
    for (int64_t k = 0; k < gk; ++k) out[k] = e4m3_to_float(row[k0 + k]);
  }
}

// dst[i, :] = decode(src[i, :]) for `rows` rows of K values (`row_bytes` bytes each).
AM_VECTOR_CLONES void decode_rows(const uint8_t* src, int64_t rows, int64_t row_bytes, int64_t K, bool fp4,
                                  float* dst) {
  for (int64_t i = 0; i < rows; ++i) decode_block(src + i * row_bytes, 0, K, fp4, dst + i * K);
}

}  // namespace

void decode_quantized_rows(const uint8_t* src, int64_t rows, int64_t row_bytes, int64_t K, bool fp4,
                           float* dst) {
  decode_rows(src, rows, row_bytes, K, fp4, dst);
}

// FP32 [rows, K] = deq(x[r0 : r0 + rows]).
at::Tensor dequantize_rows(const at::Tensor& x, const at::Tensor& sf, int64_t gmn, int64_t gk, int64_t r0,
                           int64_t rows) {
  at::Tensor out = at::empty({rows, logical_k(x)}, x.options().dtype(at::kFloat));
  dequantize_rows_into(out, x, sf, gmn, gk, r0);
  return out;
}

void dequantize_rows_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& sf, int64_t gmn, int64_t gk,
                          int64_t r0) {
  const int64_t K = logical_k(x), rows = out.size(0);
  TORCH_INTERNAL_ASSERT(out.is_contiguous() && out.scalar_type() == at::kFloat && out.size(1) == K);
  // Row-major bytes of the panel (a byte-level transpose for MN-major FP8, which is cheap).
  const at::Tensor bytes = x.narrow(0, r0, rows).view(at::kByte).contiguous();
  const uint8_t* src = bytes.const_data_ptr<uint8_t>();
  float* dst = out.data_ptr<float>();
  const bool fp4 = is_fp4(x);
  const int64_t row_bytes = fp4 ? K / 2 : K;
  at::parallel_for(0, rows, 16, [&](int64_t i0, int64_t i1) {
    decode_rows(src + i0 * row_bytes, i1 - i0, row_bytes, K, fp4, dst + i0 * K);
  });
  // Scale rows r0..r0+rows-1 use scale rows (r0 + i) / gmn: gather them, then broadcast over each K block.
  const at::Tensor idx = at::arange(r0, r0 + rows, x.options().dtype(at::kLong)).div_(gmn, "floor");
  const at::Tensor scales = sf.to(at::kFloat).index_select(0, idx);  // [rows, K / gk]
  out.view({rows, K / gk, gk}).mul_(scales.unsqueeze(-1));
}

namespace {

// Whether every FP8/FP4 value (|x| <= 448) times its scale is finite.
bool scaled_values_finite(const at::Tensor& sf) {
  return sf.numel() == 0 || at::isfinite(sf.to(at::kFloat).abs().max().mul(448.0)).item<bool>();
}

// Whether the streaming kernel's unscaled block sums (gk products of deq(A), at most 448 * |sfa|, and a code of B,
// at most 448) stay below FP32's maximum. Past it (a huge deq(A) against a small B scale) a sum overflows before
// B's scale brings it back, where the contract's deq(A) @ deq(B)^T is finite; NaN scales fail it too.
bool block_sums_fit(const at::Tensor& sfa, int64_t gk) {
  if (sfa.numel() == 0) return true;
  const double amax = sfa.to(at::kFloat).abs().max().item<double>();
  return amax * 448.0 * 448.0 * static_cast<double>(gk) < static_cast<double>(std::numeric_limits<float>::max());
}

// acc[m * ldacc + n - n0] = sum_kb sfb[n / gmn, kb] * sum_{k in kb} a[m, k] * deq(B[n, k]) for rows n0..n1 of B.
// Four rows of B at a time: four independent FMA chains, and each load of A serves four rows. `buf`
// holds 4 * gk floats.
AM_VECTOR_CLONES void stream_scaled_rows(const float* a, int64_t M, int64_t K, const uint8_t* b, int64_t ldb, bool fp4,
                                         const float* sfb, int64_t gmn, int64_t gk, int64_t n0, int64_t n1,
                                         float* acc, int64_t ldacc, float* buf) {
  const int64_t nkb = K / gk;
  float* b0 = buf;
  float* b1 = buf + gk;
  float* b2 = buf + 2 * gk;
  float* b3 = buf + 3 * gk;
  for (int64_t n = n0; n < n1; n += 4) {
    const int64_t nr = std::min<int64_t>(4, n1 - n);
    // Short tails repeat the last row rather than branching inside the vector loops.
    const int64_t rows[4] = {n, n + std::min<int64_t>(1, nr - 1), n + std::min<int64_t>(2, nr - 1),
                             n + std::min<int64_t>(3, nr - 1)};
    float sums[kStreamingMaxRows][4] = {};
    for (int64_t kb = 0; kb < nkb; ++kb) {
      const int64_t k0 = kb * gk;
      float* bufs[4] = {b0, b1, b2, b3};
      float scales[4];
      for (int r = 0; r < 4; ++r) {
        decode_block(b + rows[r] * ldb, k0, gk, fp4, bufs[r]);
        scales[r] = sfb[(rows[r] / gmn) * nkb + kb];
      }
      for (int64_t m = 0; m < M; ++m) {
        const float* arow = a + m * K + k0;
        float p0 = 0.f, p1 = 0.f, p2 = 0.f, p3 = 0.f;
#pragma omp simd reduction(+ : p0, p1, p2, p3)
        for (int64_t k = 0; k < gk; ++k) {
          const float x = arow[k];
          p0 += x * b0[k];
          p1 += x * b1[k];
          p2 += x * b2[k];
          p3 += x * b3[k];
        }
        sums[m][0] += p0 * scales[0];
        sums[m][1] += p1 * scales[1];
        sums[m][2] += p2 * scales[2];
        sums[m][3] += p3 * scales[3];
      }
    }
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t r = 0; r < nr; ++r) acc[m * ldacc + (n - n0) + r] = sums[m][r];
    }
  }
}

// acc[:, n0:n0+w] += alpha * deq(A) @ deq(B[n0:n0+w])^T for M <= kStreamingMaxRows and K-major B, on the calling
// thread (a_deq: A dequantized, row-major).
void streaming_fp8_block(at::Tensor& acc, const at::Tensor& a_deq, const at::Tensor& b, const at::Tensor& sfb_f,
                         at::IntArrayRef recipe_b, double alpha, int64_t n0, int64_t w) {
  const int64_t M = a_deq.size(0), K = a_deq.size(1);
  const at::Tensor b_bytes = b.view(at::kByte);
  at::Tensor partial = at::empty({M, w}, a_deq.options());
  std::vector<float> buf(4 * recipe_b[1]);
  stream_scaled_rows(a_deq.const_data_ptr<float>(), M, K, b_bytes.const_data_ptr<uint8_t>(), b_bytes.stride(0),
                     is_fp4(b), sfb_f.const_data_ptr<float>(), recipe_b[0], recipe_b[1], n0, n0 + w,
                     partial.data_ptr<float>(), w, buf.data());
  acc.narrow(1, n0, w).add_(partial, alpha);
}

}  // namespace

void fp8_accumulate_many(const std::vector<Fp8Job>& jobs) {
  // Per job: its path and what every block of it shares (A dequantized when small, B's FP32 scales), then one
  // parallel region over the column blocks of every job (tasks.h).
  struct Prepared {
    bool streaming = false;
    at::Tensor a_deq, sfb_f;  // a_deq undefined: A is too large to dequantize whole, each block does its panels
    int64_t a_rows = 0;
  };
  struct Block {
    size_t job;
    int64_t n0, w;
  };
  std::vector<Prepared> prep(jobs.size());
  std::vector<Block> blocks;
  int64_t work = 0;
  for (const Fp8Job& j : jobs) {
    const int64_t M = j.a.size(0), N = j.b.size(0), K = logical_k(j.a);
    if (M > 0 && N > 0) work += M * N * K;
  }
  const int64_t threads = std::min<int64_t>(threads_for(work), at::get_num_threads());
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Fp8Job& j = jobs[i];
    const int64_t M = j.a.size(0), N = j.b.size(0), K = logical_k(j.a);
    if (M == 0 || N == 0) continue;
    if (K == 0) {  // no block: its accumulator is final here
      if (j.zero_acc) j.acc.zero_();
      if (j.out.defined()) j.out.copy_(j.acc);
      continue;
    }
    Prepared& p = prep[i];
    // The streaming kernel reads each row of B as K contiguous bytes, so it needs a unit K stride whatever
    // N is (a one-row B sliced along K is not K-major); any row pitch works, 0 (an expanded B) included.
    // It scales B's block sums, not its values: the same numbers unless a value times its scale is not finite (a
    // NaN/inf scale meeting a zero, an overflow past 448 * scale), or an unscaled block sum could overflow (a huge
    // deq(A) against a small B scale), where only dequantizing first puts NaN and inf where the contract
    // (deq(A) @ deq(B)^T) has them, and nowhere else.
    p.streaming = M <= kStreamingMaxRows && j.b.stride(1) == 1 && j.recipe_b[1] % 2 == 0 &&
                  scaled_values_finite(j.sfb) && block_sums_fit(j.sfa, j.recipe_b[1]);
    const bool whole_a = M * K <= kWholeAElements;
    p.a_rows = whole_a ? M : std::max<int64_t>(64, kPanelElements / K);
    int64_t width;
    if (p.streaming) {
      p.sfb_f = j.sfb.to(at::kFloat).contiguous();
      width = streaming_columns(K);
    } else {
      width = panel_columns(N, K, M, static_cast<double>(M * N * K) / static_cast<double>(work), threads);
    }
    // A is dequantized here only when several blocks share it: a job of one block (a batched call's groups,
    // each one panel wide) dequantizes its A inside its task, in the one parallel region, not serially here
    // (the same values: dequantize_rows is elementwise).
    if (whole_a && (p.streaming || width < N)) {
      p.a_deq = dequantize_rows(j.a, j.sfa, j.recipe_a[0], j.recipe_a[1], 0, M);
    }
    for (int64_t n0 = 0; n0 < N; n0 += width) blocks.push_back({i, n0, std::min(width, N - n0)});
  }
  // Streaming blocks open no region of their own (the panels' SGEMM and dequantizing may): those calls may run
  // alone while other threads keep arriving late (tasks.h).
  const bool streaming_only =
      std::all_of(blocks.begin(), blocks.end(), [&](const Block& blk) { return prep[blk.job].streaming; });
  int64_t blocks_work = 0;  // only read where the call may run alone
  if (streaming_only) {
    for (const Block& blk : blocks) {
      blocks_work += few_rows_work(jobs[blk.job].a.size(0), jobs[blk.job].a.size(1), blk.w);
    }
  }
  parallel_tasks(static_cast<int64_t>(blocks.size()), threads, [&](int64_t t) {
    const Block& blk = blocks[t];
    const Fp8Job& j = jobs[blk.job];
    const Prepared& p = prep[blk.job];
    at::Tensor acc = j.acc;
    if (p.streaming) {
      if (j.zero_acc) acc.narrow(1, blk.n0, blk.w).zero_();
      streaming_fp8_block(acc, p.a_deq, j.b, p.sfb_f, j.recipe_b, j.alpha, blk.n0, blk.w);
    } else {
      SequentialMkl sequential;
      const at::Tensor b_panel = dequantize_rows(j.b, j.sfb, j.recipe_b[0], j.recipe_b[1], blk.n0, blk.w);
      const int64_t M = j.a.size(0);
      for (int64_t m0 = 0; m0 < M; m0 += p.a_rows) {
        const int64_t mr = std::min(p.a_rows, M - m0);
        const at::Tensor a_panel =
            p.a_deq.defined() ? p.a_deq : dequantize_rows(j.a, j.sfa, j.recipe_a[0], j.recipe_a[1], m0, mr);
        at::Tensor acc_block = acc.narrow(0, m0, mr).narrow(1, blk.n0, blk.w);
        if (j.zero_acc) acc_block.zero_();
        at::addmm_out(acc_block, acc_block, a_panel, b_panel.t(), 1.0, j.alpha);
      }
    }
    if (j.out.defined()) j.out.narrow(1, blk.n0, blk.w).copy_(acc.narrow(1, blk.n0, blk.w));
  }, streaming_only ? Alone::kWhenLate : Alone::kNever, blocks_work);
}

void fp8_gemm_accumulate(at::Tensor& acc, const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                         const at::Tensor& sfb, at::IntArrayRef recipe_a, at::IntArrayRef recipe_b, double alpha) {
  fp8_accumulate_many({Fp8Job{acc, a, sfa, b, sfb, recipe_a.vec(), recipe_b.vec(), alpha}});
}

at::Tensor with_fp32_accumulator(at::IntArrayRef shape, at::ScalarType out_t, const at::Tensor& init,
                                 const at::TensorOptions& options, const std::function<void(at::Tensor&)>& body) {
  at::Tensor out = at::empty(shape, options.dtype(out_t));
  if (out.numel() == 0) return out;
  at::Tensor acc = out_t == at::kFloat ? out : at::empty(shape, options.dtype(at::kFloat));
  if (init.defined()) {
    acc.copy_(init);
  } else {
    acc.zero_();
  }
  body(acc);
  if (!acc.is_same(out)) out.copy_(acc);
  return out;
}

void fp8_products_into(const at::Tensor& out, const at::Tensor& init,
                       const std::function<std::vector<Fp8Job>(const at::Tensor&)>& jobs_of) {
  if (out.numel() == 0) return;
  const bool direct = out.scalar_type() == at::kFloat && out.is_contiguous();
  const at::Tensor acc = direct ? out : at::empty(out.sizes(), out.options().dtype(at::kFloat));
  if (init.defined()) acc.copy_(init);
  std::vector<Fp8Job> jobs = jobs_of(acc);
  const std::vector<Fp8Job> out_jobs = direct ? std::vector<Fp8Job>() : jobs_of(out);
  TORCH_INTERNAL_ASSERT(direct || out_jobs.size() == jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    jobs[i].zero_acc = !init.defined();
    if (!direct) jobs[i].out = out_jobs[i].acc;
  }
  fp8_accumulate_many(jobs);
}

namespace {

at::Tensor fp8_gemm_cpu(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                        const std::optional<at::Tensor>& c, at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                        double alpha, std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] = fp8_gemm::fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype);
  at::Tensor out = at::empty(shape, a.options().dtype(out_t));
  fp8_products_into(out, c.value_or(at::Tensor()), [&](const at::Tensor& acc) {
    return std::vector<Fp8Job>{{acc, a, sfa, b, sfb, recipe_a.vec(), recipe_b.vec(), alpha}};
  });
  return out;
}

// out[g] = c[g] + alpha * deq(a[g]) @ deq(b[g])^T for every group (all operands already checked).
void bmm_into(const at::Tensor& out, const at::Tensor& c, const at::Tensor& a, const at::Tensor& sfa,
              const at::Tensor& b, const at::Tensor& sfb, at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
              double alpha) {
  fp8_products_into(out, c, [&](const at::Tensor& acc) {
    std::vector<Fp8Job> jobs;
    for (int64_t g = 0; g < a.size(0); ++g) {
      jobs.push_back({acc.select(0, g), a.select(0, g), sfa.select(0, g), b.select(0, g), sfb.select(0, g),
                      recipe_a.vec(), recipe_b.vec(), alpha});
    }
    return jobs;
  });
}

at::Tensor fp8_bmm_cpu(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b, const at::Tensor& sfb,
                       const std::optional<at::Tensor>& c, at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                       double alpha, std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] = fp8_gemm::fp8_bmm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype);
  at::Tensor out = at::empty(shape, a.options().dtype(out_t));
  bmm_into(out, c.value_or(at::Tensor()), a, sfa, b, sfb, recipe_a, recipe_b, alpha);
  return out;
}

at::Tensor fp8_einsum_cpu(c10::string_view equation_view, const at::Tensor& a, const at::Tensor& sfa,
                          const at::Tensor& b, const at::Tensor& sfb, const std::optional<at::Tensor>& c,
                          at::IntArrayRef recipe_a, at::IntArrayRef recipe_b, double alpha,
                          std::optional<at::ScalarType> out_dtype) {
  const std::string equation(equation_view);
  const auto [shape, out_t] =
      fp8_gemm::fp8_einsum_signature(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype);
  const fp8_gemm::EinsumPlan plan = fp8_gemm::einsum_plan(equation);
  const at::Tensor a_h = a.permute(plan.perm_a), sfa_h = sfa.permute(plan.perm_a);
  const at::Tensor b_h = b.permute(plan.perm_b), sfb_h = sfb.permute(plan.perm_b);
  // A batched GEMM over h, written through a permuted view of the einsum-layout output.
  at::Tensor out = at::empty(shape, a.options().dtype(out_t));
  bmm_into(out.permute(plan.perm_out), c.has_value() ? c->permute(plan.perm_out) : at::Tensor(), a_h, sfa_h, b_h,
           sfb_h, recipe_a, recipe_b, alpha);
  return out;
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- fp8_gemm family: D = alpha * deq(A) @ deq(B)^T + C with block scales (FP8 E4M3 or packed FP4) ----
  // deq(X)[r, k] = X[r, k] * sf[r // gran_mn, k // gran_k]; recipes are [gran_mn, gran_k] per operand.
  // FP4 operands are uint8 [MN, K / 2], two E2M1 codes per byte (low nibble first), K-major.
  m.set_python_module("torch_ascend_moe.fakes.fp8_gemm");
  m.def(
      "fp8_gemm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor? c=None, int[2] recipe_a=[1, 128], "
      "int[2] recipe_b=[128, 128], float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "fp8_bmm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor? c=None, int[2] recipe_a=[1, 128], "
      "int[2] recipe_b=[128, 128], float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Scales keep their operand's subscripts: h whole, the output letter / gran_mn, the contracted one / gran_k.
  m.def(
      "fp8_einsum(str equation, Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor? c=None, "
      "int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("fp8_gemm", &fp8_gemm_cpu);
  m.impl("fp8_bmm", &fp8_bmm_cpu);
  m.impl("fp8_einsum", &fp8_einsum_cpu);
}

}  // namespace ascend_moe
