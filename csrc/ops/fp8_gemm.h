// The fp8_gemm family's pieces other families build on (fp8_linear quantizes, then runs these).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>

namespace ascend_moe {

// Packed FP4 crosses the op boundary as uint8, two E2M1 codes per byte along K.
bool is_fp4(const at::Tensor& t);

// Logical K of an operand: FP4 stores two values per byte along K (the last dim).
int64_t logical_k(const at::Tensor& t);

// Validates one scaled operand: data [MN, K] (or [G, MN, K] when batched), its scales and recipe.
void check_fp8_operand(const char* op, const char* name, const char* sf_name, const at::Tensor& x,
                       const at::Tensor& sf, at::IntArrayRef recipe, const at::Tensor& ref, bool batched);

// Operands that may meet: FP4 A needs FP4 B (FP4 x FP8 is unsupported upstream), and one logical K.
void check_fp8_pairing(const char* op, const at::Tensor& a, const at::Tensor& b);

// out_dtype if given, else c's dtype, else `fallback`; BF16 or FP32 only, and c must agree.
at::ScalarType check_scaled_out_dtype(const char* op, const std::optional<at::Tensor>& c,
                                      std::optional<at::ScalarType> out_dtype, at::ScalarType fallback);

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

// A fresh `out_t` tensor of `shape`: an FP32 accumulator starts as `init` (broadcast; zero if undefined),
// `body` adds into it, and the result is rounded once to `out_t`.
at::Tensor with_fp32_accumulator(at::IntArrayRef shape, at::ScalarType out_t, const at::Tensor& init,
                                 const at::TensorOptions& options, const std::function<void(at::Tensor&)>& body);

}  // namespace ascend_moe
