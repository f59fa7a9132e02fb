// The fp8_linear family's argument checks, shared with the grouped family's ops that cast their own inputs
// (m_grouped_fp8_linear, m_grouped_fp8_quant_gemm). Twins of meta/fp8_linear.py's.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace ascend_moe {

// A BF16/FP32 operand of `layout`'s rank: the inputs these ops cast themselves.
void check_high_precision(const char* op, const char* name, const at::Tensor& x, const char* layout);

// `block` (the argument `arg`) is positive and divides x's K: the cast takes whole 1 x block groups.
void check_k_blocks(const char* op, const char* arg, int64_t block, const at::Tensor& x);

}  // namespace ascend_moe
