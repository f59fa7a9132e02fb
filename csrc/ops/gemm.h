// The gemm family's 2-D worker, shared with the grouped family (one call per expert segment).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace ascend_moe {

// Up to this many rows a BF16 GEMM is memory-bound: matmul_into's streaming kernel reads B once, in BF16, and
// wins over MKL's SGEMM on FP32 panels of B (bench gemm); on a CPU with BF16 dot products ATen's BF16 GEMM beats
// both from two rows on when the result is BF16 (native_bf16_dot).
constexpr int64_t kStreamingMaxRows = 8;

// Whether the CPU has BF16 dot-product instructions (AVX512-BF16, AMX-BF16), where ATen's BF16 GEMM (oneDNN)
// is the fastest way to a BF16 result (FP32 accumulation, one rounding: the same contract as ours).
bool native_bf16_dot();

// Forces native_bf16_dot() (1 / 0; -1: the CPU decides again) for tests; returns the previous setting.
int set_native_bf16_dot(int forced);

// Whether MKL's BF16 x BF16 -> FP32 GEMM is linked (matmul_into's FP32 results of BF16 operands when the native
// choice is forced on a CPU without AVX512-BF16).
bool mkl_bf16_gemm_available();

// Whether the CPU executes AVX512-BF16 (the hardware, whatever set_native_bf16_dot forces), and out[M, N] (FP32,
// unit column stride) = a[M, K] @ b[N, K]^T (+ c, FP32) of BF16 operands with its dot-product instruction
// (gemm_dot_bf16.cpp); false (nothing written) where the CPU lacks it or alpha != 1.
bool cpu_has_avx512_bf16();
bool dot_bf16_fp32_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                        double alpha);

// Whether dot_bf16_rows_block_into takes the operands: the CPU executes AVX512-BF16, a and b are BF16 with a unit
// stride along K, out (and c, if any) BF16 or FP32 of one dtype.
bool dot_bf16_rows_takes(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                         const std::optional<at::Tensor>& c);

// out[:, j0:j0+w] = alpha * a[M, K] @ b[j0:j0+w, K]^T (+ c) on the calling thread, one VDPBF16PS dot product per
// element read straight from a and b (gemm_dot_bf16.cpp): for few rows of A, where packing B costs more than the
// products. FP32 sums, one rounding into out's dtype; every element's bits depend only on its row of a and row of b.
void dot_bf16_rows_block_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b,
                              const std::optional<at::Tensor>& c, double alpha, int64_t j0, int64_t w);

// Rows up to which a BF16 job is memory-bound on B and matmul_into reads B once (the row kernel where the CPU
// executes AVX512-BF16 and native choices are on: 16 rows; else the streaming kernel: kStreamingMaxRows). Callers
// that tile B themselves hand segments this short to matmul_into whole.
int64_t few_rows_max();

// Whether every product of a nonzero value of a [(B,) M, K] and one of b [(G,) N, K] (BF16, any strides) is normal
// in FP32: then BF16 dot-product instructions, which flush subnormals, compute exactly what FP32 panels would.
bool bf16_products_normal(const at::Tensor& a, const at::Tensor& b);

// One GEMM for matmul_many: out = alpha * a @ b^T (+ c), as matmul_into's arguments.
struct MatmulJob {
  at::Tensor out;
  at::Tensor a, b;
  std::optional<at::Tensor> c;
  double alpha = 1.0;
};

// matmul_into for every job (their outputs must not overlap), with the column blocks of all of them taken as tasks
// of one parallel region (tasks.h): a grouped GEMM's experts share the threads dynamically, and a busy core holds up
// one block, not a share of every expert. Jobs whose path is one ATen/MKL call run first: several native BF16 ones
// as tasks of one region (each call on one thread), the others one after another.
void matmul_many(const std::vector<MatmulJob>& jobs);

// out[M, N] = alpha * a[M, K] @ b[N, K]^T (+ c), FP32 accumulation (FP64 for FP64 operands) and one
// rounding into out's dtype. `out` is row-major and may be a slice of a bigger output; b any majorness.
void matmul_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                 double alpha);

}  // namespace ascend_moe
