// CPU kernels of the moe_routing family: token permutation into expert-contiguous order (the layout the
// grouped GEMMs take) and its weighted inverse. torch_npu's npu_moe_init_routing_v2 / npu_moe_token_unpermute
// do the same on Ascend.
//
// moe_permute: (token t, choice j) pairs go to their expert's segment in (t, j) order (a stable counting
// sort); segments start at multiples of `alignment`; the output has the static capacity
// T*k + (E-1)*(alignment-1) rows, padding rows are zero; topk_idx -1 drops a pair (row_map -1).
#include <ATen/TensorOperators.h>
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/zeros.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "moe_routing.h"
#include "moe_routing_checks.h"
#include "rows.h"

namespace ascend_moe {
namespace {

// out[t] = round(sum_j w[t, j] * Acc(y[map[t, j]])) for tokens t0..t1, in slot order from zero: each row is
// widened as it is read, so there is no [rows, H] FP32 copy of y (fresh pages cost more than the arithmetic).
// (Pragmas cannot sit inside AT_DISPATCH's macro, hence a template.)
// The bias rows, read in y's dtype or the accumulator's (others are converted to the accumulator's first): widened
// row by row, never a full FP32 copy of a [T, H] residual.
template <typename T, typename Acc>
struct BiasRows {
  const T* same = nullptr;
  const Acc* wide = nullptr;
  void load(int64_t t, int64_t H, Acc* acc) const {
    if (same) {
      for (int64_t h = 0; h < H; ++h) acc[h] = static_cast<Acc>(same[t * H + h]);
    } else if (wide) {
      std::copy(wide + t * H, wide + (t + 1) * H, acc);
    } else {
      std::fill(acc, acc + H, Acc(0));
    }
  }
};

template <typename T, typename Acc>
void gather_weighted(const T* y, int64_t y_stride, const Acc* w, const int32_t* map, int64_t k, int64_t H,
                     int64_t t0, int64_t t1, const BiasRows<T, Acc>& bias, T* out) {
  std::vector<Acc> acc(H), weights(k);
  std::vector<const T*> rows(k);
  for (int64_t t = t0; t < t1; ++t) {
    bias.load(t, H, acc.data());
    int64_t routed = 0;  // the routed slots in order: a -1 slot adds nothing (its weight, NaN or not, unread)
    for (int64_t j = 0; j < k; ++j) {
      const int32_t r = map[t * k + j];
      if (r < 0) continue;
      if (w) weights[routed] = w[t * k + j];
      rows[routed++] = y + r * y_stride;
    }
    add_rows<T, Acc>(acc.data(), rows.data(), w ? weights.data() : nullptr, routed, H);
    store_row(acc.data(), H, out + t * H);
  }
}

}  // namespace

PermutePlan permute_plan(const int64_t* ids, int64_t T, int64_t k, int64_t E, int64_t alignment,
                         const at::TensorOptions& int_options) {
  std::vector<int64_t> counts(E, 0);
  for (int64_t i = 0; i < T * k; ++i) {
    if (ids[i] >= 0) ++counts[ids[i]];
  }
  PermutePlan plan{std::vector<int64_t>(E), at::empty({E}, int_options.dtype(at::kInt)),
                   at::empty({T, k}, int_options.dtype(at::kInt))};
  std::vector<int64_t> next(E);
  int32_t* offs = plan.offs.data_ptr<int32_t>();
  int64_t end = 0;
  for (int64_t e = 0; e < E; ++e) {
    plan.starts[e] = next[e] = (end + alignment - 1) / alignment * alignment;
    end = next[e] + counts[e];
    offs[e] = static_cast<int32_t>(end);
  }
  int32_t* rm = plan.row_map.data_ptr<int32_t>();
  for (int64_t i = 0; i < T * k; ++i) rm[i] = ids[i] >= 0 ? static_cast<int32_t>(next[ids[i]]++) : -1;
  return plan;
}

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> moe_permute_cpu(const at::Tensor& x, const at::Tensor& topk_idx,
                                                                int64_t num_experts, int64_t alignment) {
  const int64_t capacity = moe_routing::permute_signature(x, topk_idx, num_experts, alignment);
  const at::Tensor idx = topk_idx.to(at::kLong).contiguous();
  moe_routing::check_range(moe_routing::kPermute, "topk_idx", idx, num_experts, "expert ids");
  const int64_t T = x.size(0), k = topk_idx.size(1), H = x.size(1), E = num_experts;
  const PermutePlan plan = permute_plan(idx.const_data_ptr<int64_t>(), T, k, E, alignment, topk_idx.options());
  // Only the alignment padding and the rows past the last expert are zeroed: every other row gets a token.
  at::Tensor out = at::empty({capacity, H}, x.options());
  const int32_t* offs = plan.offs.const_data_ptr<int32_t>();
  for (int64_t e = 0, end = 0; e < E; end = offs[e++]) {
    if (plan.starts[e] > end) out.narrow(0, end, plan.starts[e] - end).zero_();
  }
  const int64_t end = E ? offs[E - 1] : 0;
  if (capacity > end) out.narrow(0, end, capacity - end).zero_();
  const at::Tensor& row_map = plan.row_map;
  const int32_t* rm = row_map.const_data_ptr<int32_t>();
  const at::Tensor xc = x.contiguous();
  const int64_t row_bytes = H * static_cast<int64_t>(x.element_size());
  const char* src = static_cast<const char*>(xc.const_data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  at::parallel_for(0, T, 64, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < k; ++j) {
        const int32_t r = rm[t * k + j];
        if (r >= 0) std::memcpy(dst + r * row_bytes, src + t * row_bytes, row_bytes);
      }
    }
  });
  return {out, row_map, plan.offs};
}

}  // namespace

// out[t] = bias[t] + sum_j w[t, j] * y[row_map[t, j]] over routed pairs, accumulated in FP32 (FP64 for FP64 y)
// from the bias (a residual or shared-expert output: one rounding for the whole sum).
at::Tensor moe_unpermute_cpu(const at::Tensor& y, const at::Tensor& row_map,
                             const std::optional<at::Tensor>& topk_weights, const std::optional<at::Tensor>& bias) {
  moe_routing::unpermute_signature(y, row_map, topk_weights, bias);
  moe_routing::check_range(moe_routing::kUnpermute, "row_map", row_map, y.size(0), "rows of y");
  const int64_t T = row_map.size(0), k = row_map.size(1), H = y.size(1), R = y.size(0);
  const at::ScalarType acc_t = y.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const at::Tensor w = topk_weights.has_value() ? topk_weights->to(acc_t).contiguous() : at::Tensor();
  at::Tensor b;
  if (bias.has_value()) {
    b = bias->scalar_type() == y.scalar_type() ? bias->contiguous() : bias->to(acc_t).contiguous();
  }
  const at::Tensor rm = row_map.contiguous();
  const int32_t* map = rm.const_data_ptr<int32_t>();
  const at::Tensor yc = H <= 1 || y.stride(1) == 1 ? y : y.contiguous();
  at::Tensor out = at::empty({T, H}, y.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, y.scalar_type(), "moe_unpermute", [&] {
    using Acc = at::opmath_type<scalar_t>;  // FP32 for the 16-bit types and FP32, FP64 for FP64
    const scalar_t* ys = yc.const_data_ptr<scalar_t>();
    const Acc* ws = w.defined() ? w.const_data_ptr<Acc>() : nullptr;
    BiasRows<scalar_t, Acc> bs;
    if (b.defined() && b.scalar_type() == y.scalar_type()) {
      bs.same = b.const_data_ptr<scalar_t>();
    } else if (b.defined()) {
      bs.wide = b.const_data_ptr<Acc>();
    }
    scalar_t* o = out.data_ptr<scalar_t>();
    const int64_t stride = R ? yc.stride(0) : 0;
    at::parallel_for(0, T, 16, [&](int64_t t0, int64_t t1) {
      gather_weighted<scalar_t, Acc>(ys, stride, ws, map, k, H, t0, t1, bs, o);
    });
  });
  return out;
}

namespace {

// moe_gating_topk: DeepSeek-V3 / Mixtral / Qwen-MoE gating (see torch_ascend_moe/checks/moe_routing.py for the
// definition). Selection uses stable descending sorts, so ties go to the lower expert (group) index on every
// backend; the Python twin in backends/portable/moe_routing.py runs the same ATen calls.
std::tuple<at::Tensor, at::Tensor> moe_gating_topk_cpu(const at::Tensor& logits, int64_t topk,
                                                      const std::optional<at::Tensor>& bias,
                                                      c10::string_view score_func, int64_t num_groups,
                                                      int64_t topk_groups, bool renormalize,
                                                      double routed_scaling_factor) {
  const at::ScalarType acc_t =
      moe_routing::gating_signature(logits, topk, bias, score_func, num_groups, topk_groups);
  const int64_t T = logits.size(0), E = logits.size(1), group = E / num_groups;
  const bool sigmoid = score_func == "sigmoid";
  const at::Tensor l = logits.to(acc_t);
  const at::Tensor scores = sigmoid ? l.sigmoid() : l.softmax(-1);
  at::Tensor choice = bias.has_value() ? scores + bias->to(acc_t) : scores;
  at::Tensor order = std::get<1>(at::sort(choice, /*stable=*/true, -1, /*descending=*/true));
  if (num_groups > 1 && topk_groups < num_groups) {
    const at::Tensor grouped = choice.view({T, num_groups, group});
    // DeepSeek-V3: a group's score is its best expert, or the sum of its best two when a bias is used.
    const at::Tensor group_scores =
        bias.has_value() ? std::get<0>(at::sort(grouped, /*stable=*/true, -1, /*descending=*/true))
                               .narrow(-1, 0, std::min<int64_t>(2, group))
                               .sum(-1)
                         : grouped.amax(-1);
    const at::Tensor kept = std::get<1>(at::sort(group_scores, true, -1, true)).narrow(1, 0, topk_groups);
    const at::Tensor mask = at::zeros({T, num_groups}, logits.options().dtype(at::kBool)).scatter_(1, kept, true);
    // Every expert of the kept groups comes before any other, each class in choice order (a stable sort of the
    // choice order by membership): a topk above the kept groups' experts then takes the best of the others, as
    // transformers' DeepSeek-V3 router takes some of its masked experts.
    const at::Tensor in_kept = mask.unsqueeze(-1).expand({T, num_groups, group}).reshape({T, E}).gather(1, order);
    order = order.gather(1, std::get<1>(at::sort(in_kept.to(at::kByte), true, -1, true)));
  }
  // clone, not contiguous(): an empty narrow counts as contiguous but keeps [T, E] strides.
  const at::Tensor idx = order.narrow(1, 0, topk).clone(at::MemoryFormat::Contiguous);
  at::Tensor weights = scores.gather(1, idx);
  if (renormalize) weights = weights / (weights.sum(-1, true) + 1e-20);
  if (routed_scaling_factor != 1.0) weights = weights * routed_scaling_factor;
  return {weights.clone(at::MemoryFormat::Contiguous), idx};
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- moe_routing family: tokens into expert-contiguous order and back ----
  m.set_python_module("torch_ascend_moe.fakes.moe_routing");
  // x [T, H], topk_idx [T, k] -> (permuted [T*k + (E-1)*(alignment-1), H], row_map int32 [T, k], offs int32 [E]).
  m.def(
      "moe_permute(Tensor x, Tensor topk_idx, int num_experts, int alignment=1) -> (Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // out[t] = bias[t] + sum_j topk_weights[t, j] * y[row_map[t, j]] (rows -1 skipped; weights default to 1, bias
  // to 0), summed in FP32 from the bias, slot by slot, one rounding.
  m.def("moe_unpermute(Tensor y, Tensor row_map, Tensor? topk_weights=None, Tensor? bias=None) -> Tensor",
        {at::Tag::pt2_compliant_tag});
  // Gating: scores = softmax|sigmoid(logits); top-k of scores (+ bias) within the best topk_groups of num_groups
  // groups -> (topk_weights = scores at the chosen experts, renormalized, scaled; topk_idx int64 [T, k]): torch_npu's order.
  m.def(
      "moe_gating_topk(Tensor logits, int topk, Tensor? bias=None, str score_func=\"softmax\", int num_groups=1, "
      "int topk_groups=1, bool renormalize=True, float routed_scaling_factor=1.) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("moe_permute", &moe_permute_cpu);
  m.impl("moe_unpermute", &moe_unpermute_cpu);
  m.impl("moe_gating_topk", &moe_gating_topk_cpu);
}

}  // namespace ascend_moe
