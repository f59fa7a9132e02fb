// The moe_gate family's argument and value checks (moe_topk_gate). Twin: torch_ascend_moe/checks/moe_gate.py (the
// same checks in the same order, the same words; tests/test_validation_twins.py compares them).
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "checks.h"

namespace ascend_moe::moe_gate {

constexpr const char* kOp = "ascend_moe::moe_topk_gate";
constexpr int64_t kGroupSumTopk = 2;       // a group's score: the sum of its two best ranking scores
constexpr int64_t kDuplicateHash = 23333;  // the redundant-expert choice: (ep_rank + token * 23333) % count

struct GateShapes {
  int64_t T, E;
  int64_t slots;  // num_topk + num_shared_experts
  int64_t extra;  // physical duplicates per logical expert beyond the first (to_physical_map's columns - 1)
};

inline void _vector(const char* name, const std::optional<at::Tensor>& t, int64_t length, const std::string& source,
                    at::ScalarType dtype, const at::Tensor& ref) {
  if (!t.has_value()) return;
  check_rank(kOp, name, *t, 1, ("[" + source + "]").c_str());
  AM_CHECK_ARG(t->scalar_type() == dtype, kOp, name, "dtype", dtype_name(dtype), dtype_name(t->scalar_type()));
  AM_CHECK_ARG(t->device() == ref.device(), kOp, name, "device", ref.device().str() + " (same as 'logits')",
               t->device().str());
  check_dim_size(kOp, name, *t, 0, source, length, source != "E + S" ? "logits" : "E + num_shared_experts");
}

inline void _both_or_neither(const std::optional<at::Tensor>& a, const char* a_name,
                             const std::optional<at::Tensor>& b, const char* b_name) {
  AM_CHECK_ARG(a.has_value() == b.has_value(), kOp, b_name, "presence",
               std::string("given together with '") + a_name + "'", !b.has_value() ? "None" : "a tensor");
}

// Checks the arguments.
inline GateShapes moe_topk_gate_signature(
    const at::Tensor& logits, const std::optional<at::Tensor>& bias, int64_t num_topk, int64_t num_groups,
    int64_t num_topk_groups, const std::string& scoring_func, int64_t num_shared_experts,
    const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& fix_routing_mask,
    const std::optional<at::Tensor>& unmapped_topk_idx, const std::optional<at::Tensor>& to_physical_map,
    const std::optional<at::Tensor>& logical_count, int64_t ep_rank, int64_t num_ep_ranks, int64_t tp_rank,
    int64_t num_tp_ranks, const std::optional<at::Tensor>& image_bias,
    const std::optional<at::Tensor>& image_token_mask) {
  check_rank(kOp, "logits", logits, 2, "[T, E]");
  AM_CHECK_ARG(logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kDouble, kOp, "logits", "dtype",
               "torch.float32 or torch.float64", dtype_name(logits.scalar_type()));
  const int64_t T = logits.size(0), E = logits.size(1);
  _vector("bias", bias, E, "E", logits.scalar_type(), logits);
  check_int_arg(kOp, "num_topk", num_topk, 1);
  AM_CHECK_ARG(num_topk <= E, kOp, "num_topk", "value", "at most E=" + std::to_string(E) + " (logits.size(1))",
               num_topk);
  const int64_t groups = num_groups, topk_groups = num_topk_groups;
  check_int_arg(kOp, "num_groups", groups, 0);
  check_int_arg(kOp, "num_topk_groups", topk_groups, 0);
  AM_CHECK_ARG((groups == 0) == (topk_groups == 0), kOp, "num_topk_groups", "value", "0 exactly when num_groups is 0",
               topk_groups);
  AM_CHECK_ARG(topk_groups <= groups, kOp, "num_topk_groups", "value", "at most num_groups=" + std::to_string(groups),
               topk_groups);
  if (groups) {
    AM_CHECK_ARG(E % groups == 0, kOp, "num_groups", "value", "a divisor of E=" + std::to_string(E), groups);
    if (topk_groups != groups) {
      AM_CHECK_ARG(E / groups >= kGroupSumTopk, kOp, "num_groups", "value",
                   "at most E/2=" + std::to_string(E / 2) + " (a group's score sums its top 2)", groups);
    }
  }
  AM_CHECK_ARG(scoring_func == "sigmoid" || scoring_func == "sqrtsoftplus" || scoring_func == "softmax" ||
                   scoring_func == "identity",
               kOp, "scoring_func", "value", "'sigmoid', 'sqrtsoftplus', 'softmax' or 'identity'",
               str_repr(scoring_func));
  const int64_t shared = num_shared_experts;
  AM_CHECK_ARG(shared >= 0 && shared <= 2, kOp, "num_shared_experts", "value", "0, 1 or 2", shared);
  _vector("mask", mask, T, "T", at::kBool, logits);
  _vector("fix_routing_mask", fix_routing_mask, T, "T", at::kBool, logits);
  if (fix_routing_mask.has_value()) {
    AM_CHECK_ARG(unmapped_topk_idx.has_value(), kOp, "unmapped_topk_idx", "presence", "given with 'fix_routing_mask'",
                 "None");
  }
  if (unmapped_topk_idx.has_value()) {
    const at::Tensor& unmapped = *unmapped_topk_idx;
    check_rank(kOp, "unmapped_topk_idx", unmapped, 2, "[T, num_topk]");
    AM_CHECK_ARG(unmapped.scalar_type() == at::kLong, kOp, "unmapped_topk_idx", "dtype", dtype_name(at::kLong),
                 dtype_name(unmapped.scalar_type()));
    AM_CHECK_ARG(unmapped.size(0) == T && unmapped.size(1) == num_topk, kOp, "unmapped_topk_idx", "shape",
                 shape_str({T, num_topk}), shape_str(unmapped.sizes()));
  }
  _both_or_neither(to_physical_map, "to_physical_map", logical_count, "logical_count");
  int64_t extra = 0;
  if (to_physical_map.has_value()) {
    const at::Tensor& physical = *to_physical_map;
    check_rank(kOp, "to_physical_map", physical, 2, "[E + num_shared_experts, duplicates + 1]");
    AM_CHECK_ARG(physical.scalar_type() == at::kInt, kOp, "to_physical_map", "dtype", dtype_name(at::kInt),
                 dtype_name(physical.scalar_type()));
    check_dim_size(kOp, "to_physical_map", physical, 0, "E + S", E + shared, "E + num_shared_experts");
    _vector("logical_count", logical_count, E + shared, "E + S", at::kInt, logits);
    extra = physical.size(1) - 1;
  }
  AM_CHECK_ARG(shared <= extra, kOp, "num_shared_experts", "value",
               "at most to_physical_map.size(1) - 1 = " + std::to_string(extra) +
                   " (shared experts live in the physical extra slots)",
               shared);
  check_int_arg(kOp, "num_ep_ranks", num_ep_ranks, 1);
  AM_CHECK_ARG(num_ep_ranks <= E + extra, kOp, "num_ep_ranks", "value",
               "at most E + duplicates = " + std::to_string(E + extra) + " (every rank holds an expert)",
               num_ep_ranks);
  check_int_arg(kOp, "num_tp_ranks", num_tp_ranks, 1);
  AM_CHECK_ARG(0 <= ep_rank && ep_rank < num_ep_ranks, kOp, "ep_rank", "value",
               "in [0, " + std::to_string(num_ep_ranks) + ")", ep_rank);
  AM_CHECK_ARG(0 <= tp_rank && tp_rank < num_tp_ranks, kOp, "tp_rank", "value",
               "in [0, " + std::to_string(num_tp_ranks) + ")", tp_rank);
  _both_or_neither(image_bias, "image_bias", image_token_mask, "image_token_mask");
  _vector("image_bias", image_bias, E, "E", logits.scalar_type(), logits);
  _vector("image_token_mask", image_token_mask, T, "T", at::kBool, logits);
  return {T, E, num_topk + shared, extra};
}

// The kernel's checks of values (fakes cannot see them): finite logits on routed rows, fixed indices in [-1, E),
// duplicate counts in [1, duplicates + 1]. `bad_row` / `bad_col`: the first non-finite logit of a routed row in
// row-major order (-1 if none; the kernel finds it in its own pass over the rows); `active` a contiguous bool [T].
template <typename scalar_t>
void check_values(const at::Tensor& logits, int64_t bad_row, int64_t bad_col, const bool* active,
                  const std::optional<at::Tensor>& fix_routing_mask,
                  const std::optional<at::Tensor>& unmapped_topk_idx, const std::optional<at::Tensor>& logical_count,
                  const std::optional<at::Tensor>& to_physical_map) {
  const int64_t E = logits.size(1);
  if (bad_row >= 0) {
    const double v = static_cast<double>(logits[bad_row][bad_col].item<scalar_t>());
    AM_CHECK_ARG(false, kOp, "logits", "values", "finite on routed rows",
                 float_text(v) + " at logits[" + std::to_string(bad_row) + ", " + std::to_string(bad_col) + "]");
  }
  if (fix_routing_mask.has_value()) {
    const at::Tensor fixed_rows = fix_routing_mask->contiguous();
    const at::Tensor fixed = unmapped_topk_idx->contiguous();
    const bool* fp = fixed_rows.const_data_ptr<bool>();
    const int64_t* ip = fixed.const_data_ptr<int64_t>();
    const int64_t k = fixed.size(1);
    int64_t lo = 0, hi = 0;
    bool any = false, ok = true;
    for (int64_t t = 0; t < fixed.size(0); ++t) {
      if (!fp[t] || !active[t]) continue;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t v = ip[t * k + j];
        lo = any ? std::min(lo, v) : v;
        hi = any ? std::max(hi, v) : v;
        any = true;
        ok = ok && v >= -1 && v < E;
      }
    }
    AM_CHECK_ARG(ok, kOp, "unmapped_topk_idx", "values", "in [-1, E=" + std::to_string(E) + ") on fix_routing_mask rows",
                 "min " + std::to_string(lo) + ", max " + std::to_string(hi));
  }
  if (logical_count.has_value()) {
    const at::Tensor count = logical_count->contiguous();
    const int64_t limit = to_physical_map->size(1);
    const int32_t* cp = count.const_data_ptr<int32_t>();
    const auto [lo, hi] = std::minmax_element(cp, cp + count.numel());
    AM_CHECK_ARG(*lo >= 1 && *hi <= limit, kOp, "logical_count", "values",
                 "in [1, " + std::to_string(limit) + "] (to_physical_map.size(1))",
                 "min " + std::to_string(*lo) + ", max " + std::to_string(*hi));
  }
}

}  // namespace ascend_moe::moe_gate
