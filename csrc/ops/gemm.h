// The gemm family's 2-D worker, shared with the grouped family (one call per expert segment).
#pragma once

#include <ATen/ATen.h>

#include <optional>

namespace ascend_moe {

// Up to this many rows a BF16 GEMM is memory-bound: matmul_into's streaming kernel reads B once, in BF16, and
// wins; above it MKL's SGEMM on FP32 panels of B is faster (bench gemm).
constexpr int64_t kStreamingMaxRows = 8;

// out[M, N] = alpha * a[M, K] @ b[N, K]^T (+ c), FP32 accumulation (FP64 for FP64 operands) and one
// rounding into out's dtype. `out` is row-major and may be a slice of a bigger output; b any majorness.
void matmul_into(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& c,
                 double alpha);

}  // namespace ascend_moe
