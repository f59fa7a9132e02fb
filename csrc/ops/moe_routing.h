// The moe_routing family's CPU pieces that another family's CPU code calls directly (mega_moe_cpu.cpp), on
// arguments already checked.
#pragma once
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace ascend_moe {

// moe_permute's order without the copy: expert e's rows are [starts[e], offs[e]) (starts aligned), the (t, j)
// pairs in (t, j) order within an expert (a stable counting sort); row_map int32 [T, k] (-1: not routed).
struct PermutePlan {
  std::vector<int64_t> starts;
  at::Tensor offs, row_map;
};
// ids: T * k expert ids in [-1, E), row-major; the tensors take int_options' device.
PermutePlan permute_plan(const int64_t* ids, int64_t T, int64_t k, int64_t E, int64_t alignment,
                         const at::TensorOptions& int_options);

// The CPU kernel of moe_unpermute (its checks included).
at::Tensor moe_unpermute_cpu(const at::Tensor& y, const at::Tensor& row_map,
                             const std::optional<at::Tensor>& topk_weights, const std::optional<at::Tensor>& bias);

}  // namespace ascend_moe
