// CPU kernels of the gemm family (bf16_gemm, bf16_bmm, bf16_einsum).
//
// All three reduce to one 2-D worker, `matmul_into`, that computes out = alpha * a @ b^T + c with
// FP32 accumulation (FP64 for FP64 operands) and a single rounding into the output dtype.
#include <ATen/core/Tensor.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/baddbmm.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>
#include <vector>

#include <algorithm>
#include <array>
#include <string>

#include "gemm_checks.h"
#include "vector_clones.h"
#include "gemm.h"
#include "tasks.h"

namespace ascend_moe {
namespace {

// FP16 keeps ATen's kernel for few rows (kStreamingMaxRows: gemm.h).
constexpr int64_t kNativeReducedMaxRows = 4;
// BF16 -> BF16 without C from this many rows on: ATen's (oneDNN's) BF16 GEMM (matmul_into).
constexpr int64_t kNativeBf16MinRows = 2;

bool is_reduced(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }


// ---- streaming BF16 kernel for few rows: reads B once, converts in registers, FP32 accumulators ----
// target_clones builds an AVX2+FMA and a baseline version and picks one at load time, so the wheel
// stays portable while AVX2 machines get 8-wide FMAs.

constexpr int64_t kStreamColumns = 1024;  // MN-major B: columns per pass (accumulators stay in L1/L2)

inline float bf16_to_float(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

AM_VECTOR_CLONES void widen_bf16_row(const uint16_t* src, int64_t n, float* dst) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

// acc[m * ldacc + j] = sum_k a[m, k] * B[j, k] for K-major B (row j at b + j * ldb). Four rows of B go
// together: four independent FMA chains hide FMA latency, and each load of A serves four rows. B is
// converted in registers; its four rows (4 * K * 2 bytes) stay in L1/L2 while every row of A passes.
AM_VECTOR_CLONES void stream_rows_k_major(const float* a, int64_t M, int64_t K, const uint16_t* b, int64_t ldb,
                                          int64_t rows, float* acc, int64_t ldacc) {
  for (int64_t j0 = 0; j0 < rows; j0 += 4) {
    const int64_t nr = std::min<int64_t>(4, rows - j0);
    // Short tails repeat the last row rather than branching inside the vector loop.
    const uint16_t* b0 = b + j0 * ldb;
    const uint16_t* b1 = b + (j0 + std::min<int64_t>(1, nr - 1)) * ldb;
    const uint16_t* b2 = b + (j0 + std::min<int64_t>(2, nr - 1)) * ldb;
    const uint16_t* b3 = b + (j0 + std::min<int64_t>(3, nr - 1)) * ldb;
    for (int64_t m = 0; m < M; ++m) {
      const float* arow = a + m * K;
      float s0 = 0.f, s1 = 0.f, s2 = 0.f, s3 = 0.f;
#pragma omp simd reduction(+ : s0, s1, s2, s3)
      for (int64_t k = 0; k < K; ++k) {
        const float x = arow[k];
        s0 += x * bf16_to_float(b0[k]);
        s1 += x * bf16_to_float(b1[k]);
        s2 += x * bf16_to_float(b2[k]);
        s3 += x * bf16_to_float(b3[k]);
      }
      const float sums[4] = {s0, s1, s2, s3};
      for (int64_t r = 0; r < nr; ++r) acc[m * ldacc + j0 + r] = sums[r];
    }
  }
}

// acc[m * ldacc + j] = sum_k a[m, k] * B[k][j] for MN-major B (row k of the stored [K, N] at b + k * ldb).
// Four rows of B per pass: one load/store of the accumulator serves four FMAs.
AM_VECTOR_CLONES_WIDE void stream_cols_mn_major(const float* a, int64_t M, int64_t K, const uint16_t* b, int64_t ldb,
                                           int64_t cols, float* acc, int64_t ldacc) {
  for (int64_t m = 0; m < M; ++m) std::fill(acc + m * ldacc, acc + m * ldacc + cols, 0.f);
  int64_t k = 0;
  for (; k + 4 <= K; k += 4) {
    const uint16_t *b0 = b + k * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb, *b3 = b2 + ldb;
    // The pass's columns of the four rows after next, requested into L2: four rows of a few KiB read side by side
    // are too short a stream for the hardware prefetcher (the row kernel's finding, gemm_dot_bf16.cpp).
    for (int64_t r = k + 8; r < std::min(k + 12, K); ++r) {
      const char* row = reinterpret_cast<const char*>(b + r * ldb);
      for (int64_t off = 0; off < cols * 2; off += 64) __builtin_prefetch(row + off, 0, 2);
    }
    for (int64_t m = 0; m < M; ++m) {
      const float w0 = a[m * K + k], w1 = a[m * K + k + 1], w2 = a[m * K + k + 2], w3 = a[m * K + k + 3];
      float* arow = acc + m * ldacc;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) {
        arow[j] += w0 * bf16_to_float(b0[j]) + w1 * bf16_to_float(b1[j]) + w2 * bf16_to_float(b2[j]) +
                   w3 * bf16_to_float(b3[j]);
      }
    }
  }
  for (; k < K; ++k) {
    const uint16_t* brow = b + k * ldb;
    for (int64_t m = 0; m < M; ++m) {
      const float w = a[m * K + k];
      float* arow = acc + m * ldacc;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) arow[j] += w * bf16_to_float(brow[j]);
    }
  }
}

// Columns per streaming task over an MN-major B (row k of the stored [K, N] holds the task's columns side by side):
// each task reads `width` values from every one of the K rows, so a narrow task reads a few cache lines per 4 KiB
// page of B and misses the TLB on nearly every row. As wide as four tasks per thread allow, up to a pass of the
// kernel (kStreamColumns); never narrower than the K-major tasks. Each column's sum runs over k in the same order
// whatever the width: the same bits.
int64_t mn_major_streaming_columns(int64_t N, int64_t K, int64_t threads) {
  const int64_t balanced = (N / std::max<int64_t>(4 * threads, 1)) / 16 * 16;
  return std::max(streaming_columns(K), std::min(kStreamColumns, balanced));
}

bool streams(const at::Tensor& a, const at::Tensor& b) {
  return a.scalar_type() == at::kBFloat16 && a.size(0) <= kStreamingMaxRows && (b.stride(1) == 1 || b.stride(0) == 1);
}

// out[:, j0:j0+w] = alpha * a @ b[j0:j0+w]^T (+ c) for BF16 a[M<=8, K] (a_f: its FP32 copy), b[N, K] with a unit
// stride, on the calling thread.
void streaming_block_into(at::Tensor& out, const at::Tensor& a_f, const at::Tensor& b,
                          const std::optional<at::Tensor>& c, double alpha, int64_t j0, int64_t w) {
  const int64_t M = a_f.size(0), K = a_f.size(1);
  const bool k_major = b.stride(1) == 1;
  const int64_t ldb = k_major ? b.stride(0) : b.stride(1);
  const auto* b_ptr = reinterpret_cast<const uint16_t*>(b.const_data_ptr<at::BFloat16>());
  const float* a_ptr = a_f.const_data_ptr<float>();
  at::Tensor acc = at::empty({M, w}, a_f.options());
  float* acc_ptr = acc.data_ptr<float>();
  if (k_major) {
    stream_rows_k_major(a_ptr, M, K, b_ptr + j0 * ldb, ldb, w, acc_ptr, w);
  } else {
    for (int64_t c0 = 0; c0 < w; c0 += kStreamColumns) {
      stream_cols_mn_major(a_ptr, M, K, b_ptr + j0 + c0, ldb, std::min(kStreamColumns, w - c0), acc_ptr + c0, w);
    }
  }
  if (alpha != 1.0) acc.mul_(alpha);
  if (c.has_value()) acc.add_(c->narrow(1, j0, w));
  out.narrow(1, j0, w).copy_(acc);
}

// FP32 copy of a 2-D BF16/FP16 operand made on the calling thread, keeping its majorness so the copy streams
// through memory. Inside a task it must not open a parallel region; for A it is O(M K) beside the GEMM's O(M N K),
// and a region of its own would be a second barrier per call.
at::Tensor float_copy_here(const at::Tensor& x) {
  const bool mn_major = x.stride(1) != 1 && x.stride(0) == 1 && x.size(1) > 1;
  const at::Tensor v = mn_major ? x.t() : x;
  if (x.scalar_type() != at::kBFloat16 || (v.stride(1) != 1 && v.size(1) > 1) || at::in_parallel_region()) {
    const at::Tensor f = v.to(at::kFloat, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
    return mn_major ? f.t() : f;
  }
  at::Tensor f = at::empty(v.sizes(), v.options().dtype(at::kFloat));
  const int64_t rows = v.size(0), cols = v.size(1), ld = v.stride(0);
  const auto* src = reinterpret_cast<const uint16_t*>(v.const_data_ptr<at::BFloat16>());
  float* dst = f.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) widen_bf16_row(src + r * ld, cols, dst + r * cols);
  return mn_major ? f.t() : f;
}

}  // namespace

// ATen's BF16 GEMM beats converting B to FP32 panels for MKL's SGEMM by 2-4x where the CPU has BF16 dot products
// (issue 21, measured on an AVX512-BF16 EPYC); without them oneDNN emulates BF16 and the conversion path wins.
namespace {
// Tests force the native paths on a CPU without BF16 dot products (set_native_bf16_dot): they run there too, with
// ATen's and MKL's emulation, so their choices and numerics are checked on every machine. -1: the CPU decides.
std::atomic<int> native_override{-1};
}  // namespace

bool native_bf16_dot() {
  const int forced = native_override.load(std::memory_order_relaxed);
  if (forced >= 0) return forced != 0;
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
  }();
  return has;
#else
  return false;
#endif
}

int set_native_bf16_dot(int forced) { return native_override.exchange(forced < 0 ? -1 : forced != 0); }

namespace {

// Per value: its magnitude bits minus one, in 15 bits (a zero wraps to 0x7FFF, above every nonzero value), so one
// unsigned 16-bit min finds the smallest nonzero magnitude of a row. A min is the same in any lane order: an
// AVX-512 clone too (the baseline build's SSE2 loop scanned 11 GB/s, a 512x1024 activation in 95 us, ~1% of the
// GEMM after it; AVX-512 82 GB/s in cache).
AM_VECTOR_CLONES_WIDE uint16_t smallest_magnitude_less_one(const uint16_t* row, int64_t n) {
  uint16_t lo = 0x7FFF;
#pragma omp simd reduction(min : lo)
  for (int64_t j = 0; j < n; ++j) {
    const uint16_t v = static_cast<uint16_t>((row[j] - 1u) & 0x7FFFu);
    lo = v < lo ? v : lo;
  }
  return lo;
}

// Smallest biased exponent among the nonzero values of a 2-D BF16 tensor (0: a subnormal value; 255 when every
// value is zero, inf or NaN). Memory-bound, one pass, parallel over rows.
int64_t min_bf16_exponent(const at::Tensor& t) {
  if (t.dim() == 3) {  // batches / groups one 2-D view at a time: never a copy of a permuted operand
    int64_t lo = 255;
    for (int64_t i = 0; i < t.size(0) && lo > 0; ++i) lo = std::min(lo, min_bf16_exponent(t.select(0, i)));
    return lo;
  }
  const at::Tensor m = t.stride(1) == 1 || t.size(1) <= 1 ? t : (t.stride(0) == 1 ? t.t() : t.contiguous());
  const int64_t rows = m.size(0), cols = m.size(1), ld = m.stride(0);
  const auto* base = reinterpret_cast<const uint16_t*>(m.const_data_ptr<at::BFloat16>());
  // The smallest nonzero magnitude's exponent is the answer. Below 2^22 values (8 MiB, ~0.4 ms on one thread) on
  // the calling thread: a parallel region of its own before the GEMM's waits, with another process on a core, for
  // the thread sharing that core (bench gemm --busy: a 256-row GEMM on oneDNN's path read 0.69x torch.mm, its only
  // extra being this region).
  const int64_t rows_per_task =
      rows * cols < (int64_t{1} << 22) ? rows : (int64_t{1} << 16) / std::max<int64_t>(cols, 1);
  const int64_t smallest = at::parallel_reduce(
      0, rows, std::max<int64_t>(rows_per_task, 1), int64_t{0x7FFF},
      [&](int64_t r0, int64_t r1, int64_t acc) {
        for (int64_t r = r0; r < r1; ++r) {
          acc = std::min<int64_t>(acc, smallest_magnitude_less_one(base + r * ld, cols));
        }
        return acc;
      },
      [](int64_t x, int64_t y) { return std::min(x, y); });
  return smallest == 0x7FFF ? 255 : ((smallest + 1) >> 7) & 0xFF;
}

}  // namespace

namespace {

// The B operand is usually a weight read by call after call (every expert of a grouped GEMM, every step of a
// layer): its smallest exponent is remembered per view (storage, offset, sizes, strides) and version counter, so
// a call scans only A. The entry holds a weak reference to the storage: a freed storage never matches again (its
// StorageImpl cannot be reused at the same address while the weak reference lives), and an in-place change bumps
// the version. (A write through `.data` or another tensor sharing the storage without its version counter is not
// seen: such a stale verdict can only pick oneDNN's path for operands that gained subnormal values.)
struct ExponentEntry {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage{c10::weak_intrusive_ptr<c10::StorageImpl>::reclaim(nullptr)};
  int64_t offset = 0;
  std::vector<int64_t> sizes, strides;
  uint32_t version = 0;
  int64_t exponent = 0;
};

constexpr size_t kExponentCacheSize = 1024;

int64_t cached_min_bf16_exponent(const at::Tensor& t) {
  // Inference tensors have no version counter: nothing tells a changed value, so they are scanned every call.
  if (!t.has_storage() || t.is_inference()) return min_bf16_exponent(t);
  static std::mutex mutex;
  static std::vector<ExponentEntry> cache(kExponentCacheSize);
  static size_t next = 0;
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const uint32_t version = t._version();
  const auto matches = [&](const ExponentEntry& e) {
    return e.storage._unsafe_get_target() == storage && !e.storage.expired() && e.version == version &&
           e.offset == t.storage_offset() && t.sizes().equals(e.sizes) && t.strides().equals(e.strides);
  };
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const ExponentEntry& e : cache)
      if (matches(e)) return e.exponent;
  }
  const int64_t exponent = min_bf16_exponent(t);
  std::lock_guard<std::mutex> lock(mutex);
  ExponentEntry& e = cache[next++ % kExponentCacheSize];
  e.storage = t.storage().getWeakStorageImpl();
  e.offset = t.storage_offset();
  e.sizes = t.sizes().vec();
  e.strides = t.strides().vec();
  e.version = version;
  e.exponent = exponent;
  return exponent;
}

}  // namespace

bool bf16_products_normal(const at::Tensor& a, const at::Tensor& b) {
  // |a_ik * b_jk| >= 2^(e_a - 127) * 2^(e_b - 127) for the smallest nonzero exponents: normal in FP32 when
  // e_a + e_b >= 128; a subnormal operand (exponent 0) is flushed by the BF16 dot instructions whatever the other.
  const int64_t ea = min_bf16_exponent(a);
  if (ea == 0) return false;
  const int64_t eb = cached_min_bf16_exponent(b);
  return eb > 0 && ea + eb >= 128;
}

// MKL's BF16 x BF16 -> FP32 GEMM (LP64 CBLAS), which libtorch_cpu exports where PyTorch links MKL statically (the
// x86 wheels); weak, so the extension loads without it and keeps the FP32-panel path. ATen has no BF16 -> FP32 GEMM
// on CPU (its cpublas overload is not exported). FP32 results of BF16 operands take our AVX512-BF16 kernel where the
// CPU has the instruction (gemm_dot_bf16.cpp: MKL took its generic code on an AVX512-BF16 AMD EPYC, slower than
// the panels); MKL's is the native choice only where tests force it on other CPUs (MKL emulates BF16 there).
extern "C" __attribute__((weak)) void cblas_gemm_bf16bf16f32(int layout, int transa, int transb, int m, int n, int k,
                                                             float alpha, const void* a, int lda, const void* b,
                                                             int ldb, float beta, float* c, int ldc);

bool mkl_bf16_gemm_available() { return cblas_gemm_bf16bf16f32 != nullptr; }

void late_threads_state(bool reset, const long long region[4], long long state[4]) {
  LateThreads& late = LateThreads::get();
  if (reset) late.reset();
  if (region[0] >= 0) late.region_took(region[0], region[1], region[2], region[3]);
  state[0] = late.late_in_a_row.load();
  state[1] = late.alone_calls.load();
  state[2] = late.late_wall_ns.load();
  state[3] = late.ps_per_work.load();
}

namespace {

constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;

// (transposed?, leading dimension) of a 2-D operand for a row-major CBLAS call, or (false, 0) when neither
// dimension has unit stride (or a dimension overflows CBLAS's 32-bit integers).
std::pair<bool, int64_t> cblas_operand(const at::Tensor& t) {
  const int64_t r = t.size(0), c = t.size(1);
  if (r > INT_MAX || c > INT_MAX) return {false, 0};
  // The other stride must step over a whole row (column): a broadcast (stride 0) or overlapping view is refused.
  if ((t.stride(1) == 1 || c == 1) && (r == 1 || t.stride(0) >= c)) return {false, r == 1 ? c : t.stride(0)};
  if ((t.stride(0) == 1 || r == 1) && (c == 1 || t.stride(1) >= r)) return {true, c == 1 ? r : t.stride(1)};
  return {false, 0};
}

// out (FP32) = alpha * a @ b^T (+ c, FP32) through MKL's BF16 GEMM; false (nothing written) when it cannot take the
// operands' layout.
bool mkl_bf16_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                   double alpha) {
  const auto [ta, lda] = cblas_operand(a);
  const auto [tb_rows, ldb] = cblas_operand(b);  // b [N, K] row-major is B^T: the call's "Trans" case
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  if (lda == 0 || ldb == 0 || out.stride(1) != 1 || out.stride(0) > INT_MAX || lda > INT_MAX || ldb > INT_MAX)
    return false;
  if (c.has_value() && !c->is_same(out)) out.copy_(*c);
  cblas_gemm_bf16bf16f32(kCblasRowMajor, ta ? kCblasTrans : kCblasNoTrans, tb_rows ? kCblasNoTrans : kCblasTrans,
                         static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), static_cast<float>(alpha),
                         a.const_data_ptr(), static_cast<int>(lda), b.const_data_ptr(), static_cast<int>(ldb),
                         c.has_value() ? 1.0f : 0.0f, out.mutable_data_ptr<float>(),
                         static_cast<int>(std::max<int64_t>(out.stride(0), 1)));
  return true;
}

// An FP32 result of BF16 operands (C absent or FP32) on a CPU with BF16 dot products, whose products stay normal
// (the dot instructions flush subnormals, as in native_bf16_result).
bool native_fp32_result(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                        const std::optional<at::Tensor>& c) {
  return a.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kFloat &&
         (!c.has_value() || c->scalar_type() == at::kFloat) && native_bf16_dot() && bf16_products_normal(a, b);
}

// A BF16 result of BF16 operands (C absent or BF16) on a CPU where ATen's BF16 GEMM is the fast one, whose
// products stay normal (oneDNN's BF16 dot products flush subnormals: the panel path keeps them exact).
bool native_bf16_result(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                        const std::optional<at::Tensor>& c) {
  return a.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16 &&
         (!c.has_value() || c->scalar_type() == at::kBFloat16) && native_bf16_dot() && bf16_products_normal(a, b);
}

}  // namespace

namespace {

// How a job is computed. kStreaming and kPanels split into column blocks, which matmul_many runs as tasks of one
// parallel region; the others are one ATen/MKL call with their own threading.
enum class Path { kNothing, kDotRows, kNativeBf16, kStreaming, kNativeFp32, kNarrowReduced, kWide, kPanels };

// Up to this many rows, BF16 operands with a K-major B take dot_bf16_rows_block_into where the CPU executes
// AVX512-BF16 (set_native_bf16_dot(0) turns it off with the other native paths); choose_path says why 16.
constexpr int64_t kDotRowsMaxRows = 16;

// Whether the row kernel is on: the CPU executes AVX512-BF16 and the native paths are not forced off.
bool row_kernel_on() { return native_bf16_dot() && cpu_has_avx512_bf16(); }

}  // namespace

int64_t few_rows_max() { return row_kernel_on() ? kDotRowsMaxRows : kStreamingMaxRows; }

namespace {

Path choose_path(const MatmulJob& j) {
  const at::Tensor &out = j.out, &a = j.a, &b = j.b;
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  if (M == 0 || N == 0 || K == 0) return Path::kNothing;
  const at::ScalarType in_t = a.scalar_type();
  // Up to 16 rows against a K-major B where the CPU executes AVX512-BF16 (BF16 or FP32 out): the row kernel, which
  // reads B once without packing it. Measured against oneDNN on weights not in cache (AVX512-BF16 EPYC, N x K of
  // 1024x1024 to 7168x2048, 1 and 2 threads): 1.2-2.8x at 2-8 rows, 0.87-1.5x at 16, 0.80-1.2x at 24-32; at 1 row
  // 1.2-2.4x the streaming kernel.
  // BF16 in and out (C absent or BF16), more rows, a CPU with BF16 dot products: ATen's BF16 GEMM (oneDNN: BF16
  // products accumulated in FP32 with C, one rounding at the end, as ours; the FP32 sums in another order: within an
  // ulp of ours) is 2-4x faster than converting to FP32 panels for SGEMM, at 1 and 2 threads. Without the row kernel
  // (AMX-only CPUs, forced native choices) one row stays on the streaming kernel, which reads B once and wins there.
  // (ATen has no BF16 -> FP32 GEMM on CPU: FP32 results of BF16 operands keep the panel path.)
  if (in_t == at::kBFloat16 && M <= kDotRowsMaxRows && row_kernel_on() && dot_bf16_rows_takes(a, b, out, j.c) &&
      bf16_products_normal(a, b))
    return Path::kDotRows;
  if (in_t == at::kBFloat16 && M >= kNativeBf16MinRows && native_bf16_result(a, b, out, j.c)) return Path::kNativeBf16;
  if (streams(a, b)) return Path::kStreaming;
  // FP32 out of BF16 operands (the grouped weight gradient) where the CPU multiplies BF16 natively: our VDPBF16PS
  // kernel, else MKL's BF16 GEMM (forced native choices on other CPUs: MKL emulates) (FP32 accumulation with C, as
  // the panel path; another summation order).
  if (native_fp32_result(a, b, out, j.c)) return Path::kNativeFp32;
  if (is_reduced(in_t) && out.scalar_type() == in_t && M <= kNativeReducedMaxRows && b.stride(1) == 1)
    return Path::kNarrowReduced;
  return is_reduced(in_t) ? Path::kPanels : Path::kWide;
}

// Runs a job whose path is one call; false for the paths run as column blocks (and a native FP32 job that neither
// native kernel took: it goes to the panels).
bool run_whole(const MatmulJob& j, Path path) {
  at::Tensor out = j.out;
  const at::Tensor &a = j.a, &b = j.b;
  const std::optional<at::Tensor>& c = j.c;
  const double beta = c.has_value() ? 1.0 : 0.0;  // beta == 0 makes addmm ignore its input entirely
  switch (path) {
    case Path::kNothing:
      if (a.size(0) > 0 && b.size(0) > 0) {  // K == 0: the empty sum
        if (c.has_value()) {
          out.copy_(*c);
        } else {
          out.zero_();
        }
      }
      return true;
    case Path::kNativeBf16:
    case Path::kNarrowReduced:
      at::addmm_out(out, c.has_value() ? *c : out, a, b.t(), beta, j.alpha);  // C joins the FP32 sum: one rounding
      return true;
    case Path::kNativeFp32:
      return dot_bf16_fp32_into(out, a, b, c, j.alpha) ||
             (mkl_bf16_gemm_available() && mkl_bf16_into(out, a, b, c, j.alpha));
    case Path::kWide: {
      const at::ScalarType acc_t = a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      at::Tensor acc = out.scalar_type() == acc_t ? out : at::empty(out.sizes(), a.options().dtype(acc_t));
      if (c.has_value()) acc.copy_(*c);
      at::addmm_out(acc, acc, a.to(acc_t), b.to(acc_t).t(), beta, j.alpha);
      if (!acc.is_same(out)) out.copy_(acc);
      return true;
    }
    default:
      return false;
  }
}

// out[:, j0:j0+w] = alpha * a @ b[j0:j0+w]^T (+ c) through MKL's SGEMM on FP32 copies (a_f: A's, made once per
// job; B's block converted here): exact FP32 accumulation, one rounding into out's dtype.
void panel_block_into(const MatmulJob& j, const at::Tensor& a_f, int64_t j0, int64_t w) {
  SequentialMkl sequential;
  at::Tensor out = j.out.narrow(1, j0, w);
  const bool direct = out.scalar_type() == at::kFloat;
  at::Tensor acc = direct ? out : at::empty(out.sizes(), a_f.options());
  if (j.c.has_value()) acc.copy_(j.c->narrow(1, j0, w));
  at::addmm_out(acc, acc, a_f, float_copy_here(j.b.narrow(0, j0, w)).t(), j.c.has_value() ? 1.0 : 0.0, j.alpha);
  if (!direct) out.copy_(acc);
}

}  // namespace

namespace {

// The native BF16 jobs of a call (one oneDNN GEMM each: the experts of a grouped GEMM). Several of them run as tasks
// of one parallel region, largest first, each GEMM on its worker's thread (oneDNN opens no region inside one), instead
// of one after another with oneDNN's own threads: one fork and join per call instead of one per expert. With one core
// busy, every join waited for the thread sharing that core, up to a scheduler slice per expert (issue 51: 256
// experts of 16 rows ran 1.6x slower than idle against torch._grouped_mm's 1.0x). A job above a thread's share of
// the call's work keeps oneDNN's threads (run first, whole); so do all where the work is too small for two threads.
// oneDNN's BF16 GEMM gives the same bits on one thread as on several (tests/grouped/test_one_parallel_region.py).
void run_native_jobs(const std::vector<MatmulJob>& jobs, const std::vector<size_t>& native) {
  const auto work = [&](size_t i) { return jobs[i].a.size(0) * jobs[i].a.size(1) * jobs[i].b.size(0); };
  int64_t total = 0;
  for (const size_t i : native) total += work(i);
  const int64_t threads = std::min<int64_t>(threads_for(total), at::get_num_threads());
  std::vector<size_t> tasks;
  for (const size_t i : native) {
    if (threads <= 1 || native.size() < 2 || work(i) * threads > total) {
      run_whole(jobs[i], Path::kNativeBf16);
    } else {
      tasks.push_back(i);
    }
  }
  std::stable_sort(tasks.begin(), tasks.end(), [&](size_t x, size_t y) { return work(x) > work(y); });
  parallel_tasks(static_cast<int64_t>(tasks.size()), threads,
                 [&](int64_t t) { run_whole(jobs[tasks[t]], Path::kNativeBf16); });
}

}  // namespace

void matmul_many(const std::vector<MatmulJob>& jobs) {
  struct Block {
    size_t job;
    Path path;
    int64_t j0, w;
  };
  std::vector<Block> blocks;
  std::vector<at::Tensor> a_float(jobs.size());
  int64_t work = 0;
  // The blocked jobs' sizes decide the threads, then the panel widths.
  std::vector<Path> paths(jobs.size());
  std::vector<size_t> native;
  for (size_t i = 0; i < jobs.size(); ++i) {
    paths[i] = choose_path(jobs[i]);
    if (paths[i] == Path::kNativeBf16) {
      native.push_back(i);
      continue;
    }
    if (run_whole(jobs[i], paths[i])) continue;
    if (paths[i] == Path::kNativeFp32) paths[i] = Path::kPanels;
    work += jobs[i].a.size(0) * jobs[i].a.size(1) * jobs[i].b.size(0);
  }
  run_native_jobs(jobs, native);
  const int64_t threads = std::min<int64_t>(threads_for(work), at::get_num_threads());
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (paths[i] == Path::kDotRows) {
      // Four tasks per thread, as the panels (a dense GEMM's 16 rows ran 10% faster than in 2^17-value tasks), never
      // narrower than the streaming tasks.
      const int64_t N = jobs[i].b.size(0);
      const int64_t width = std::max(streaming_columns(jobs[i].a.size(1)), N / (4 * threads) / 4 * 4);
      for (int64_t j0 = 0; j0 < N; j0 += width) blocks.push_back({i, Path::kDotRows, j0, std::min(width, N - j0)});
      continue;
    }
    if (paths[i] != Path::kStreaming && paths[i] != Path::kPanels) continue;
    const bool streaming = paths[i] == Path::kStreaming;
    // The streaming kernel reads A row-major.
    a_float[i] = streaming ? float_copy_here(jobs[i].a).contiguous() : float_copy_here(jobs[i].a);
    const int64_t M = jobs[i].a.size(0), N = jobs[i].b.size(0), K = jobs[i].a.size(1);
    const double share = static_cast<double>(M * K * N) / static_cast<double>(std::max<int64_t>(work, 1));
    const int64_t width = !streaming                      ? panel_columns(N, K, M, share, threads)
                          : jobs[i].b.stride(1) == 1 ? streaming_columns(K)
                                                     : mn_major_streaming_columns(N, K, threads);
    for (int64_t j0 = 0; j0 < N; j0 += width) blocks.push_back({i, paths[i], j0, std::min(width, N - j0)});
  }
  // The row and streaming kernels' blocks open no region of their own (the panels' SGEMM and copies may): those
  // calls may run alone while other threads keep arriving late (tasks.h).
  const bool own_kernels = std::all_of(blocks.begin(), blocks.end(), [](const Block& blk) {
    return blk.path == Path::kDotRows || blk.path == Path::kStreaming;
  });
  int64_t blocks_work = 0;  // only read where the call may run alone
  if (own_kernels) {
    for (const Block& blk : blocks) {
      blocks_work += few_rows_work(jobs[blk.job].a.size(0), jobs[blk.job].a.size(1), blk.w);
    }
  }
  parallel_tasks(static_cast<int64_t>(blocks.size()), threads, [&](int64_t t) {
    const Block& blk = blocks[t];
    const MatmulJob& j = jobs[blk.job];
    at::Tensor out = j.out;
    if (blk.path == Path::kDotRows) {
      dot_bf16_rows_block_into(out, j.a, j.b, j.c, j.alpha, blk.j0, blk.w);
    } else if (blk.path == Path::kStreaming) {
      streaming_block_into(out, a_float[blk.job], j.b, j.c, j.alpha, blk.j0, blk.w);
    } else {
      panel_block_into(j, a_float[blk.job], blk.j0, blk.w);
    }
  }, own_kernels ? Alone::kWhenLate : Alone::kNever, blocks_work);
}

void matmul_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                 double alpha) {
  matmul_many({MatmulJob{out, a, b, c, alpha}});
}

namespace {

at::Tensor bf16_gemm_cpu(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                         double alpha, std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] = gemm::gemm_signature(a, b, c, out_dtype);
  at::Tensor out = at::empty(shape, a.options().dtype(out_t));
  matmul_into(out, a, b, c, alpha);
  return out;
}

// out[i] = alpha * a[i] @ b[i]^T (+ c[i]) for every batch index, into a preallocated [B, M, N] output.
void bmm_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
              double alpha) {
  if (a.size(1) >= kNativeBf16MinRows && a.size(0) > 0 && a.size(2) > 0 && b.size(1) > 0 &&
      native_bf16_result(a, b, out, c)) {
    // One batched oneDNN call (see matmul_into) instead of a GEMM per batch.
    at::baddbmm_out(out, c.has_value() ? *c : out, a, b.transpose(1, 2), c.has_value() ? 1.0 : 0.0, alpha);
    return;
  }
  std::vector<MatmulJob> jobs;
  for (int64_t i = 0; i < a.size(0); ++i) {
    jobs.push_back({out.select(0, i), a.select(0, i), b.select(0, i),
                    c.has_value() ? std::optional<at::Tensor>(c->select(0, i)) : std::nullopt, alpha});
  }
  matmul_many(jobs);
}

at::Tensor bf16_bmm_cpu(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                        double alpha, std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] = gemm::bmm_signature(a, b, c, out_dtype);
  at::Tensor out = at::empty(shape, a.options().dtype(out_t));
  bmm_into(out, a, b, c, alpha);
  return out;
}

at::Tensor bf16_einsum_cpu(c10::string_view equation_view, const at::Tensor& a, const at::Tensor& b,
                           const std::optional<at::Tensor>& c, double alpha,
                           std::optional<at::ScalarType> out_dtype) {
  const std::string equation(equation_view);
  const auto [shape, out_t] = gemm::einsum_signature(equation, a, b, c, out_dtype);
  at::Tensor out = at::empty(shape, a.options().dtype(out_t));

  if (equation == "bmk,bnk->mn") {
    // Sum over s of A[s] @ B[s]^T is one GEMM over the flattened (s, k) reduction axis.
    const int64_t S = a.size(0), K = a.size(2);
    const at::Tensor a2 = a.permute({1, 0, 2}).reshape({a.size(1), S * K});
    const at::Tensor b2 = b.permute({1, 0, 2}).reshape({b.size(1), S * K});
    matmul_into(out, a2, b2, c, alpha);
    return out;
  }
  // The three per-head equations: batch over h, write through a permuted view of the output.
  at::Tensor a_h, b_h, out_h;
  std::optional<at::Tensor> c_h;
  if (equation == "bhr,hdr->bhd") {  // out[h] (B x D) = A[:, h] (B x R) @ W[h] (D x R)^T
    a_h = a.transpose(0, 1);
    b_h = b;
    out_h = out.transpose(0, 1);
    if (c.has_value()) c_h = c->transpose(0, 1);
  } else if (equation == "bhd,hdr->bhr") {  // out[h] (B x R) = A[:, h] (B x D) @ W[h] (D x R)
    a_h = a.transpose(0, 1);
    b_h = b.transpose(1, 2);
    out_h = out.transpose(0, 1);
    if (c.has_value()) c_h = c->transpose(0, 1);
  } else {  // "bhd,bhr->hdr": out[h] (D x R) = A[:, h]^T (D x B) @ B[:, h] (B x R)
    a_h = a.permute({1, 2, 0});
    b_h = b.permute({1, 2, 0});
    out_h = out;
    c_h = c;
  }
  // Each out_h[h] is a row-major slice (unit column stride), which the worker writes in place.
  bmm_into(out_h, a_h, b_h, c_h, alpha);
  return out;
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- gemm family: D = alpha * A @ B^T + C over logical A[M, K], B[N, K] (any majorness) ----
  m.set_python_module("torch_ascend_moe.fakes.gemm");
  m.def(
      "bf16_gemm(Tensor a, Tensor b, Tensor? c=None, float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "bf16_bmm(Tensor a, Tensor b, Tensor? c=None, float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "bf16_einsum(str equation, Tensor a, Tensor b, Tensor? c=None, float alpha=1., "
      "ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("bf16_gemm", &bf16_gemm_cpu);
  m.impl("bf16_bmm", &bf16_bmm_cpu);
  m.impl("bf16_einsum", &bf16_einsum_cpu);
}

}  // namespace ascend_moe
