// CPU kernel of the moe_gate family: DeepSeek's fused MoE gate as TileKernels computes it (specs/tilekernels_deepselect.md
// §3.3, §10.2), with the device-generic kernel's results (torch_ascend_moe/backends/portable/moe_gate.py, which serves
// CUDA and NPU): the scores and the weights' sums come from its ATen ops (bit for bit on row-major logits at one
// thread: gate_scores_into), the ranking from the same comparisons. What that kernel does with a stable sort of every
// [T, E] row (40 of its 54 ms at 4096 tokens of 256 experts, one thread), this one does per row with a top-k list of
// length num_topk, blocks of rows taken a few at a time over the threads in one parallel region (tasks.h).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <c10/util/ParallelGuard.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "moe_gate_checks.h"
#include "tasks.h"
#include "vector_clones.h"

namespace ascend_moe {

namespace {

// Whether a ranks strictly above b in torch.sort(descending=True, stable=True): NaN above every number, -0.0 and +0.0
// equal (the lower column first, as every tie).
template <typename scalar_t>
inline bool ranks_above(scalar_t a, scalar_t b) {
  if (std::isnan(a)) return !std::isnan(b);
  return !std::isnan(b) && a > b;
}

// The columns of the k best of v[0, n) in torch.sort(descending=True, stable=True)'s order (its first k indices),
// into cols; `best` holds the values alongside (k entries of scratch). A value that ranks above the k-th so far moves
// in after every value ranking at least as high (ties: the lower column first).
template <typename scalar_t>
inline void stable_topk_row(const scalar_t* v, int64_t n, int64_t k, int64_t* cols, scalar_t* best) {
  int64_t held = 0;
  for (int64_t j = 0; j < n; ++j) {
    const scalar_t x = v[j];
    if (held == k && !ranks_above(x, best[k - 1])) continue;
    int64_t p = held < k ? held++ : k - 1;
    for (; p > 0 && ranks_above(x, best[p - 1]); --p) {
      best[p] = best[p - 1];
      cols[p] = cols[p - 1];
    }
    best[p] = x;
    cols[p] = j;
  }
}

// A row's passes over its E values, written out per type (GCC leaves a template's clone scalar) with AVX-512 and AVX2
// clones: every step is one element's exact operation and the flags are ORs, so no lane count changes a bit.
// all_finite: x - x is 0 exactly for a finite x, NaN for inf and NaN. ranking_row: base + bias (no bias: + 0.0, which
// turns -0.0 into +0.0 as the portable kernel's zeros do); returns whether a ranking value is NaN.
#define AM_GATE_ROW_PASSES(T)                                                                                  \
  AM_VECTOR_CLONES_WIDE bool all_finite(const T* x, int64_t n) {                                           \
    int finite = 1;                                                                                        \
    for (int64_t e = 0; e < n; ++e) finite &= x[e] - x[e] == T(0);                                         \
    return finite != 0;                                                                                    \
  }                                                                                                        \
  AM_VECTOR_CLONES_WIDE bool ranking_row(const T* base, const T* bias, T* out, int64_t n) {                \
    int nan = 0;                                                                                           \
    if (bias != nullptr) {                                                                                 \
      for (int64_t e = 0; e < n; ++e) {                                                                    \
        out[e] = base[e] + bias[e];                                                                        \
        nan |= out[e] != out[e];                                                                           \
      }                                                                                                    \
    } else {                                                                                               \
      for (int64_t e = 0; e < n; ++e) {                                                                    \
        out[e] = base[e] + T(0);                                                                           \
        nan |= out[e] != out[e];                                                                           \
      }                                                                                                    \
    }                                                                                                      \
    return nan != 0;                                                                                       \
  }                                                                                                        \
  /* stable_topk_row for a v without NaN (a plain > ranks), skipping blocks of 16 values below the k-th so far */   \
  /* with one vector compare: after the first few blocks of a row nearly every block is skipped. */                \
  AM_VECTOR_CLONES_WIDE void plain_topk_row(const T* v, int64_t n, int64_t k, int64_t* cols, T* best) {            \
    constexpr int64_t kBlock = 16;                                                                                 \
    int64_t held = 0;                                                                                              \
    for (int64_t j = 0; j < n;) {                                                                                  \
      int64_t end = std::min(n, j + kBlock);                                                                       \
      if (held == k && end - j == kBlock) {                                                                        \
        const T threshold = best[k - 1];                                                                           \
        int above = 0;                                                                                             \
        for (int64_t i = 0; i < kBlock; ++i) above |= v[j + i] > threshold;                                        \
        if (!above) {                                                                                              \
          j = end;                                                                                                 \
          continue;                                                                                                \
        }                                                                                                          \
      }                                                                                                            \
      for (; j < end; ++j) {                                                                                       \
        const T x = v[j];                                                                                          \
        if (held == k && !(x > best[k - 1])) continue;                                                             \
        int64_t p = held < k ? held++ : k - 1;                                                                     \
        for (; p > 0 && x > best[p - 1]; --p) {                                                                    \
          best[p] = best[p - 1];                                                                                   \
          cols[p] = cols[p - 1];                                                                                   \
        }                                                                                                          \
        best[p] = x;                                                                                               \
        cols[p] = j;                                                                                               \
      }                                                                                                            \
    }                                                                                                              \
  }
AM_GATE_ROW_PASSES(float)
AM_GATE_ROW_PASSES(double)
#undef AM_GATE_ROW_PASSES

// The unbiased scores u of some rows (routing_math.gate_scores) into `out`, by the portable kernel's ATen ops: their
// vectorized and scalar paths round differently in the last place (ATen's sqrt is not IEEE's either: sqrt(0.6931472f)
// gives 0.83255458, the correctly rounded value is 0.83255464), so the same ops, on row blocks whose values are a
// whole number of 64-value vector steps (rows_per_task): every value but the tensor's last few takes the vectorized
// path, as in one call over the whole tensor, wherever the block starts. Serial (ParallelGuard): called inside the
// call's one region, and alone when the other threads come late.
void gate_scores_into(at::Tensor& out, const at::Tensor& logits, const std::string& scoring_func) {
  c10::ParallelGuard serial(true);
  if (scoring_func == "sigmoid") {
    at::sigmoid_out(out, logits);
  } else if (scoring_func == "sqrtsoftplus") {
    at::softplus_out(out, logits, 1, 20).sqrt_();
  } else if (scoring_func == "identity") {
    out.copy_(logits);
  } else {
    at::_softmax_out(out, logits, -1, false);  // row by row: a row's bits do not depend on the block
  }
}

// Rows of [T, E] per task: about 2^14 ranking values, so a task amortises taking it and a thread slowed by another
// process holds up little of the call; a multiple of 64 values (gate_scores_into).
constexpr int64_t kValuesPerTask = int64_t{1} << 14;
inline int64_t rows_per_task(int64_t E) {
  const int64_t step = 64 / std::gcd<int64_t>(E, 64);
  const int64_t want = std::max<int64_t>(1, kValuesPerTask / E);
  return (want + step - 1) / step * step;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> moe_topk_gate_cpu(
    const at::Tensor& logits, const std::optional<at::Tensor>& bias, int64_t num_topk, int64_t num_groups,
    int64_t num_topk_groups, c10::string_view scoring_func_view, double routed_scaling_factor,
    int64_t num_shared_experts, const std::optional<at::Tensor>& mask, const std::optional<at::Tensor>& fix_routing_mask,
    const std::optional<at::Tensor>& unmapped_topk_idx, const std::optional<at::Tensor>& to_physical_map,
    const std::optional<at::Tensor>& logical_count, int64_t ep_rank, int64_t num_ep_ranks, int64_t tp_rank,
    int64_t num_tp_ranks, const std::optional<at::Tensor>& image_bias,
    const std::optional<at::Tensor>& image_token_mask, bool clamp_denominator) {
  const std::string scoring_func(scoring_func_view);
  const moe_gate::GateShapes sh = moe_gate::moe_topk_gate_signature(
      logits, bias, num_topk, num_groups, num_topk_groups, scoring_func, num_shared_experts, mask, fix_routing_mask,
      unmapped_topk_idx, to_physical_map, logical_count, ep_rank, num_ep_ranks, tp_rank, num_tp_ranks, image_bias,
      image_token_mask);
  const int64_t T = sh.T, E = sh.E, k = num_topk;
  const at::Tensor active_t = mask.has_value() ? mask->contiguous() : at::ones({T}, logits.options().dtype(at::kBool));
  const bool* active = active_t.const_data_ptr<bool>();
  const at::Tensor lg = logits.contiguous();
  // Masked rows are zeroed in u in place (the portable kernel's where(mask, u, 0)).
  at::Tensor u = at::empty({T, E}, logits.options());
  const at::Tensor base = scoring_func == "softmax" ? lg : u;
  const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();
  const at::Tensor image_bias_c = image_bias.has_value() ? image_bias->contiguous() : at::Tensor();
  const at::Tensor image_rows = image_token_mask.has_value() ? image_token_mask->contiguous() : at::Tensor();
  const at::Tensor fixed_rows = fix_routing_mask.has_value() ? fix_routing_mask->contiguous() : at::Tensor();
  const at::Tensor fixed_idx = fix_routing_mask.has_value() ? unmapped_topk_idx->contiguous() : at::Tensor();
  at::Tensor idx = at::empty({T, k}, logits.options().dtype(at::kLong));
  const bool grouped = num_groups != num_topk_groups;
  const int64_t group_size = grouped ? E / num_groups : E;
  // Per row: the first non-finite logit's column of an active row (-1: none); the first such row raises.
  std::vector<int64_t> bad_col(static_cast<size_t>(T), -1);

  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "moe_topk_gate", [&] {
    const scalar_t* lp = lg.const_data_ptr<scalar_t>();
    const scalar_t* bp = base.const_data_ptr<scalar_t>();
    const scalar_t* biasp = bias_c.defined() ? bias_c.const_data_ptr<scalar_t>() : nullptr;
    const scalar_t* imgp = image_bias_c.defined() ? image_bias_c.const_data_ptr<scalar_t>() : nullptr;
    const bool* image = image_rows.defined() ? image_rows.const_data_ptr<bool>() : nullptr;
    const bool* fixed = fixed_rows.defined() ? fixed_rows.const_data_ptr<bool>() : nullptr;
    const int64_t* fixp = fixed_idx.defined() ? fixed_idx.const_data_ptr<int64_t>() : nullptr;
    int64_t* ip = idx.data_ptr<int64_t>();
    scalar_t* up = u.data_ptr<scalar_t>();
    const int64_t rows = rows_per_task(E);
    const int64_t tasks = (T + rows - 1) / rows;
    const scalar_t minus_inf = -std::numeric_limits<scalar_t>::infinity();
    parallel_tasks(tasks, tasks, [&](int64_t task) {
      const int64_t held = std::max({k, num_topk_groups, moe_gate::kGroupSumTopk});
      std::vector<scalar_t> ranking(static_cast<size_t>(E)), best(static_cast<size_t>(held));
      std::vector<scalar_t> group_score(static_cast<size_t>(std::max<int64_t>(num_groups, 1)));
      std::vector<int64_t> kept(static_cast<size_t>(std::max<int64_t>(num_topk_groups, 1)));
      std::vector<char> keep(static_cast<size_t>(std::max<int64_t>(num_groups, 1)));
      const int64_t t0 = task * rows, t1 = std::min(T, t0 + rows);
      at::Tensor scores = u.narrow(0, t0, t1 - t0);
      gate_scores_into(scores, lg.narrow(0, t0, t1 - t0), scoring_func);
      for (int64_t t = t0; t < t1; ++t) {
        int64_t* row_idx = ip + t * k;
        if (!active[t]) {  // every output of a masked row is masked: any valid index does
          std::fill(row_idx, row_idx + k, 0);
          std::fill_n(up + t * E, E, scalar_t(0));
          continue;
        }
        const scalar_t* row_logits = lp + t * E;
        if (!all_finite(row_logits, E)) {
          bad_col[t] = std::find_if_not(row_logits, row_logits + E, [](scalar_t x) { return std::isfinite(x); }) -
                       row_logits;
          std::fill(row_idx, row_idx + k, 0);
          continue;
        }
        if (fixed != nullptr && fixed[t]) {
          std::copy_n(fixp + t * k, k, row_idx);
          continue;
        }
        // ranking = base + bias (zeros without one: -0.0 + 0.0 is +0.0 there too), image_bias on image rows.
        const scalar_t* row_bias = image != nullptr && image[t] ? imgp : biasp;
        const bool nan = ranking_row(bp + t * E, row_bias, ranking.data(), E);
        const auto top_k = [&](const scalar_t* v, int64_t n, int64_t count, int64_t* cols) {
          if (nan) {
            stable_topk_row(v, n, count, cols, best.data());
          } else {
            plain_topk_row(v, n, count, cols, best.data());
          }
        };
        if (grouped) {
          // A group's score: the sum of its top 2 (ATen's sum from zero); the best num_topk_groups groups stay.
          for (int64_t g = 0; g < num_groups; ++g) {
            int64_t top2[moe_gate::kGroupSumTopk];
            top_k(ranking.data() + g * group_size, group_size, moe_gate::kGroupSumTopk, top2);
            group_score[g] = (scalar_t(0) + best[0]) + best[1];
          }
          stable_topk_row(group_score.data(), num_groups, num_topk_groups, kept.data(), best.data());  // inf - inf
          std::fill(keep.begin(), keep.end(), 0);
          for (int64_t i = 0; i < num_topk_groups; ++i) keep[kept[i]] = 1;
          for (int64_t g = 0; g < num_groups; ++g) {
            if (!keep[g]) std::fill_n(ranking.data() + g * group_size, group_size, minus_inf);
          }
        }
        top_k(ranking.data(), E, k, row_idx);
      }
    }, Alone::kWhenLate, T * E, LateThreads::Units::kGateRows);  // tasks without a region of their own
  });

  for (int64_t t = 0; t < T; ++t) {
    if (bad_col[t] >= 0) {
      AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "moe_topk_gate_check", [&] {
        moe_gate::check_values<scalar_t>(lg, t, bad_col[t], active, fix_routing_mask, unmapped_topk_idx,
                                         logical_count, to_physical_map);
      });
    }
  }
  AT_DISPATCH_FLOATING_TYPES(logits.scalar_type(), "moe_topk_gate_check", [&] {
    moe_gate::check_values<scalar_t>(lg, -1, -1, active, fix_routing_mask, unmapped_topk_idx, logical_count,
                                     to_physical_map);
  });

  // The weights by the portable kernel's ATen ops (its sums, so its bits), serial: [T, k] is small, and one region per
  // call. A fixed -1 slot reads expert 0's score into the sum, as TileKernels' reference does.
  c10::ParallelGuard serial(true);
  const at::Tensor active_col = active_t.unsqueeze(1);
  const at::Tensor unmapped = at::where(active_col, idx, -1);
  const at::Tensor s = u.gather(1, idx.clamp_min(0));
  const at::Tensor total = s.sum(-1, /*keepdim=*/true);
  const at::Tensor denominator = clamp_denominator ? total.clamp_min(1e-20) : total + 1e-20;
  at::Tensor weights = s / denominator * routed_scaling_factor;
  const int64_t shared = num_shared_experts, slots = sh.slots;
  if (shared) {
    idx = at::cat({idx, at::arange(E, E + shared, idx.options()).expand({T, shared})}, 1);
    weights = at::cat({weights, at::ones({T, shared}, weights.options())}, 1);
  }
  // Redundant experts (logical -> physical), then the EP/TP mask (routing_math.tp_masked), per slot in place.
  const at::Tensor physical = to_physical_map.has_value() ? to_physical_map->contiguous() : at::Tensor();
  const at::Tensor count = logical_count.has_value() ? logical_count->contiguous() : at::Tensor();
  const int32_t* mp = physical.defined() ? physical.const_data_ptr<int32_t>() : nullptr;
  const int32_t* cp = count.defined() ? count.const_data_ptr<int32_t>() : nullptr;
  const int64_t columns = physical.defined() ? physical.size(1) : 0;
  const int64_t per_rank = (E + sh.extra) / num_ep_ranks, per_dp = per_rank * num_tp_ranks;
  int64_t* ip = idx.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < slots; ++j) {
      int64_t v = ip[t * slots + j];
      if (mp != nullptr && v >= 0) {
        const int64_t duplicate = (ep_rank + t * moe_gate::kDuplicateHash) % cp[v];
        v = mp[v * columns + duplicate];
      }
      const bool keep = v >= 0 && (v / per_rank) % num_tp_ranks == tp_rank;
      const int64_t local = v - tp_rank * per_rank;
      const int64_t remapped = keep ? local - local / per_dp * (per_dp - per_rank) : -1;
      ip[t * slots + j] = active[t] && keep && remapped >= 0 ? remapped : -1;
    }
  }
  return {at::where(active_col, weights, 0), idx, unmapped, u};
}

}  // namespace

// The family's schema (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file).
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- moe_gate family: scores, group-limited top-k, weights, shared slots, redundant experts, EP/TP masks ----
  m.set_python_module("torch_ascend_moe.fakes.moe_gate");
  // -> (topk_weights [T, k + S], topk_idx int64 [T, k + S], unmapped_topk_idx int64 [T, k], scores [T, E]):
  // u = sigmoid | sqrt(softplus) | softmax | identity of logits; rank u + bias (softmax: logits + bias; image_bias on
  // image_token_mask rows) within the best num_topk_groups groups by their top-2 sum; stable top-k (or the caller's
  // unmapped_topk_idx on fix_routing_mask rows); w = u / max(sum u, 1e-20) (or sum u + 1e-20 without
  // clamp_denominator) * routed_scaling_factor; S shared slots E.. with weight 1; logical -> physical through
  // to_physical_map[e, (ep_rank + t * 23333) % logical_count[e]]; experts off this TP rank -> -1, the others
  // renumbered; rows with mask False: -1 / 0. scores = u (0 on masked rows), what the backward needs.
  m.def(
      "moe_topk_gate(Tensor logits, Tensor? bias, int num_topk, int num_groups=0, int num_topk_groups=0, "
      "str scoring_func=\"sigmoid\", float routed_scaling_factor=1., int num_shared_experts=0, Tensor? mask=None, "
      "Tensor? fix_routing_mask=None, Tensor? unmapped_topk_idx=None, Tensor? to_physical_map=None, "
      "Tensor? logical_count=None, int ep_rank=0, int num_ep_ranks=1, int tp_rank=0, int num_tp_ranks=1, "
      "Tensor? image_bias=None, Tensor? image_token_mask=None, bool clamp_denominator=True) "
      "-> (Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) { m.impl("moe_topk_gate", &moe_topk_gate_cpu); }

}  // namespace ascend_moe
