// The fp8_gemm family's pieces other families build on (fp8_linear quantizes, then runs these).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

#include "fp8_gemm_checks.h"

namespace ascend_moe {

// The operand model (is_fp4, logical_k) lives with the checks; the kernels of every family read it unqualified.
using fp8_gemm::is_fp4;
using fp8_gemm::logical_k;

// dst[i, :K] = FP32 values of `rows` FP8 (E4M3) or packed FP4 (E2M1) rows of `row_bytes` bytes, unscaled.
void decode_quantized_rows(const uint8_t* src, int64_t rows, int64_t row_bytes, int64_t K, bool fp4, float* dst);

// FP32 [rows, K] = deq(x[r0 : r0 + rows]) with scales sf[ceil(MN / gmn), K / gk] (FP32 or E8M0).
at::Tensor dequantize_rows(const at::Tensor& x, const at::Tensor& sf, int64_t gmn, int64_t gk, int64_t r0,
                           int64_t rows);

// The same into `out` (contiguous FP32 [rows, K]: e.g. a run of rows of a larger buffer), rows r0..r0+rows-1.
void dequantize_rows_into(at::Tensor& out, const at::Tensor& x, const at::Tensor& sf, int64_t gmn, int64_t gk,
                          int64_t r0);

// acc (FP32 [M, N]) += alpha * deq(a) @ deq(b)^T, a and b checked. Never dequantizes a large operand
// whole: B goes panel by panel (or streams, for a few rows of A).
void fp8_gemm_accumulate(at::Tensor& acc, const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                         const at::Tensor& sfb, at::IntArrayRef recipe_a, at::IntArrayRef recipe_b, double alpha);

// One product for fp8_accumulate_many: acc += alpha * deq(a) @ deq(b)^T, as fp8_gemm_accumulate's arguments.
struct Fp8Job {
  at::Tensor acc;
  at::Tensor a, sfa, b, sfb;
  std::vector<int64_t> recipe_a, recipe_b;
  double alpha = 1.0;
  // Set by fp8_products_into: acc holds no values yet (each block's task zeroes its part first), and `out` (acc's
  // shape, any dtype), when defined, receives each finished block rounded to its dtype.
  bool zero_acc = false;
  at::Tensor out;
};

// fp8_gemm_accumulate for every job (their accumulators must not overlap), the column blocks of all of them taken
// as tasks of one parallel region (tasks.h).
void fp8_accumulate_many(const std::vector<Fp8Job>& jobs);

// A fresh `out_t` tensor of `shape`: an FP32 accumulator starts as `init` (broadcast; zero if undefined),
// `body` adds into it, and the result is rounded once to `out_t`.
at::Tensor with_fp32_accumulator(at::IntArrayRef shape, at::ScalarType out_t, const at::Tensor& init,
                                 const at::TensorOptions& options, const std::function<void(at::Tensor&)>& body);

// out (a fresh result or a view of one, any dtype) = init (broadcast; zero if undefined) + the products of
// jobs_of(acc), rounded once to out's dtype, where acc is out itself when FP32 and contiguous, else an FP32
// accumulator of its shape (jobs_of is called again on out for the jobs' `out` views, so it must build the same
// jobs on any tensor of that shape). Elements no job covers are the caller's to write, in out (init or not). Unlike
// with_fp32_accumulator, the zeroing and the rounding happen in each block's task: the call's one parallel region
// is the products' own.
void fp8_products_into(const at::Tensor& out, const at::Tensor& init,
                       const std::function<std::vector<Fp8Job>(const at::Tensor&)>& jobs_of);

}  // namespace ascend_moe
