// The grouped family's kernels that another family's CPU code calls directly (mega_moe_cpu.cpp), on arguments
// already checked.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "grouped_checks.h"

namespace ascend_moe {

// m_grouped_bf16_gemm_swiglu's work: (out [M, I] of out_t, FP8 scales [M, ceil(I / gran)] or [M, 0]) for the
// expert segments of an M-row L1 input. `source` null: that input is `a` itself. Otherwise row r of it is a's row
// source[r] (a row-major, unit column stride), gathered per row block inside the tasks, so the expert-ordered copy
// of a never exists; the GEMM calls and their bits are those of the copy. `scanned` holds the input's values (for
// the subnormal check that picks the path: a itself, or the rows that reach a segment).
std::tuple<at::Tensor, at::Tensor> bf16_swiglu_segments(const at::Tensor& a, const int64_t* source, int64_t M,
                                                        const at::Tensor& scanned, const at::Tensor& b,
                                                        const std::vector<grouped::Segment>& segments,
                                                        const std::optional<at::Tensor>& row_weights,
                                                        std::optional<double> activation_clamp, int64_t quant_gran_k,
                                                        bool use_ue8m0, at::ScalarType out_t);

// k_grouped_bf16_gemm's work; `into` (contiguous, the result's shape and dtype) receives the result instead of a
// fresh tensor (mega_moe's eager backward writes each expert weight's gradient into the previous step's buffer once
// nothing else holds it: autograd/mega_moe.py).
at::Tensor k_grouped_bf16_gemm_into(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout,
                                    int64_t num_groups, bool psum, int64_t alignment,
                                    const std::optional<at::Tensor>& c, std::optional<at::ScalarType> out_dtype,
                                    const std::optional<at::Tensor>& into);

}  // namespace ascend_moe
