// The quant family's casts: DeepGEMM's reference quantizers (torch_ascend_moe/quant/reference.py), bit for
// bit. The one implementation behind the quantize_fp8 / quantize_fp4 / dequantize ops and every op that
// quantizes inside (fp8_quant_gemm, fp8_linear, m_grouped_fp8_linear).
//
// Per rows x cols block of x [R, C]: amax in FP32 (a block holding NaN gets a NaN amax), floored at 1e-4 and
// divided by the format's maximum (448 for E4M3, 6 for E2M1), optionally rounded up to a power of two
// (UE8M0); x is multiplied by the scale's reciprocal and rounded to the format. Blocks past the edge cover
// only the rows and columns that exist, as zero padding would.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace ascend_moe {

// (E4M3 [R, C], FP32 scales [ceil(R / gr), ceil(C / gc)]) of a BF16/FP16/FP32/FP64 [R, C] matrix.
std::pair<at::Tensor, at::Tensor> quantize_blocks(const at::Tensor& x, int64_t gr, int64_t gc, bool ue8m0);

// (uint8 [R, C / 2] E2M1 codes, two per byte, element 2j in the low nibble of byte j; FP32 scales
// [ceil(R / gr), ceil(C / gc)]) of a matrix with an even C. E2M1 rounding is DeepGEMM's: the magnitude code
// counts the midpoints |x| strictly exceeds (ties to the smaller magnitude); a value rounding to 0 has no sign.
std::pair<at::Tensor, at::Tensor> quantize_blocks_fp4(const at::Tensor& x, int64_t gr, int64_t gc, bool ue8m0);

// Power-of-two (or NaN) FP32 scales [S, n] -> int32 [S, ceil(n / 4)], scale 4i + j in byte j of word i
// (upstream's packing); a ragged count is padded with scale 1.0 (code 127), as per_token_cast_to_fp4 does.
at::Tensor pack_ue8m0(const at::Tensor& sf);

}  // namespace ascend_moe
