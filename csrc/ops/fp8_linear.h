// The fp8_linear family's cast, shared with the grouped family's FP8 training op.
#pragma once

#include <ATen/ATen.h>

#include <utility>

namespace ascend_moe {

// (E4M3 [R, C], FP32 scales [ceil(R / gr), ceil(C / gc)]) of a BF16/FP32 [R, C] matrix in gr x gc blocks,
// bit-identical to quant.block_cast_to_fp8 (amax / 448 floored at 1e-4, optional UE8M0 rounding).
std::pair<at::Tensor, at::Tensor> quantize_blocks(const at::Tensor& x, int64_t gr, int64_t gc, bool ue8m0);

}  // namespace ascend_moe
