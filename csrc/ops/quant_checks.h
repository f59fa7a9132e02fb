// The quant family's argument checks (quantize_fp8, quantize_fp4, dequantize). Twin: torch_ascend_moe/checks/quant.py
// (the same checks in the same order, the same words; tests/test_validation_twins.py compares them; quantize_blocks
// has no C++ kernel, so its checks are Python's alone).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <vector>

#include "checks.h"

namespace ascend_moe::quant {

constexpr const char* kQuantizeFp8 = "ascend_moe::quantize_fp8";
constexpr const char* kQuantizeFp4 = "ascend_moe::quantize_fp4";
constexpr const char* kDequantize = "ascend_moe::dequantize";

inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// UE8M0 codes packed per word of an integer scale dtype (4 in int32, 2 in int16); 1 for an unpacked one.
inline int64_t packed_per_word(at::ScalarType t) { return t == at::kInt ? 4 : (t == at::kShort ? 2 : 1); }

inline void check_block(const char* op, at::IntArrayRef block) {
  AM_CHECK_ARG(block.size() == 2 && block[0] > 0 && block[1] > 0, op, "block", "value",
               "[rows, cols] with positive entries", shape_str(block));
  AM_CHECK_ARG(block[0] <= kMaxIntArg && block[1] <= kMaxIntArg, op, "block", "value",
               "[rows, cols] with entries at most 2147483647", shape_str(block));
}

// Checks a quantize_fp8 (fp4 false) or quantize_fp4 call.
inline void quantize_signature(const char* op, const at::Tensor& x, at::IntArrayRef block, bool use_ue8m0,
                               bool use_packed_ue8m0, bool fp4) {
  check_rank(op, "x", x, 2, "[M, N]");
  AM_CHECK_ARG(is_gemm_dtype(x.scalar_type()), op, "x", "dtype", kGemmDtypes, dtype_name(x.scalar_type()));
  check_block(op, block);
  if (fp4) {
    AM_CHECK_ARG(x.size(1) % 2 == 0, op, "x", "size(1)", "an even number (two E2M1 codes per byte)", x.size(1));
  }
  AM_CHECK_ARG(!use_packed_ue8m0 || use_ue8m0, op, "use_packed_ue8m0", "value", "False unless use_ue8m0", "True");
}

// Checks a dequantize call.
inline void dequantize_signature(const at::Tensor& data, const at::Tensor& scale, at::IntArrayRef block,
                                 std::optional<at::ScalarType> out_dtype) {
  const char* op = kDequantize;
  check_rank(op, "data", data, 2, "[M, N] (FP8) or [M, N/2] (FP4 packed in uint8)");
  const bool fp4 = data.scalar_type() == at::kByte;
  AM_CHECK_ARG(fp4 || data.scalar_type() == at::kFloat8_e4m3fn, op, "data", "dtype",
               "torch.float8_e4m3fn, or torch.uint8 (packed FP4)", dtype_name(data.scalar_type()));
  check_block(op, block);
  AM_CHECK_ARG(scale.device() == data.device(), op, "scale", "device", data.device().str() + " (same as 'data')",
               scale.device().str());
  const at::ScalarType st = scale.scalar_type();
  const int64_t per = packed_per_word(st);
  AM_CHECK_ARG(st == at::kFloat || st == at::kFloat8_e8m0fnu || per > 1, op, "scale", "dtype",
               "torch.float32, torch.float8_e8m0fnu, torch.int32 or torch.int16 (packed UE8M0)", dtype_name(st));
  const int64_t m = data.size(0), n = fp4 ? 2 * data.size(1) : data.size(1);
  const std::vector<int64_t> expected{ceil_div(m, block[0]), ceil_div(ceil_div(n, block[1]), per)};
  const std::string how = per > 1 ? "(ceil(M / block[0]), ceil(ceil(N / block[1]) / " + std::to_string(per) + "))"
                                  : "(ceil(M / block[0]), ceil(N / block[1]))";
  AM_CHECK_ARG(scale.sizes() == at::IntArrayRef(expected), op, "scale", "shape", shape_str(expected) + " " + how,
               shape_str(scale.sizes()));
  if (out_dtype.has_value()) {
    AM_CHECK_ARG(is_gemm_dtype(*out_dtype), op, "out_dtype", "value", kGemmDtypes, dtype_name(*out_dtype));
  }
}

}  // namespace ascend_moe::quant
