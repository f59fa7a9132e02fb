// CPU kernels of the grouped family: MoE grouped GEMMs (m-grouped contiguous, m-grouped masked,
// k-grouped): every expert segment's GEMM handed at once to the gemm family's worker (`matmul_many`,
// `fp8_accumulate_many`), which runs their column blocks in one parallel region, so no per-expert Python sits on the
// hot path and no expert is a barrier of its own.
//
// Layouts (specs/deepgemm_api.md §4, §6): psum = cumulative group ends [G] (torch._grouped_mm's `offs`),
// group g spans rows [align(end_{g-1}, alignment), end_g); ids = one group id per row [M], -1 = padding.
// Rows outside every group are written as zeros.
#include <ATen/core/Tensor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fp8_gemm.h"
#include "gemm.h"
#include "grouped.h"
#include "grouped_checks.h"
#include "tasks.h"
#include "quant.h"
#include "rows.h"

namespace ascend_moe {
namespace {

using grouped::Segment;

// Zeroes the rows of out no segment owns (the GEMMs write every other row): runs between and after segments.
void zero_unowned_rows(at::Tensor& out, const std::vector<Segment>& segments) {
  const int64_t M = out.size(0);
  std::vector<char> owned(M, 0);
  for (const Segment& s : segments) std::fill(owned.begin() + s.begin, owned.begin() + s.end, 1);
  for (int64_t r = 0; r < M;) {
    if (owned[r]) {
      ++r;
      continue;
    }
    int64_t e = r;
    while (e < M && !owned[e]) ++e;
    out.narrow(0, r, e - r).zero_();
    r = e;
  }
}

at::Tensor m_grouped_bf16_gemm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout, bool psum,
                                   int64_t alignment, std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] = grouped::m_grouped_signature(a, b, layout, psum, alignment, out_dtype);
  at::Tensor out = at::empty(shape, a.options().dtype(out_t));
  const std::vector<Segment> segments =
      grouped::layout_segments(grouped::kMGrouped, layout, psum, alignment, a.size(0), b.size(0));
  zero_unowned_rows(out, segments);
  std::vector<MatmulJob> jobs;
  for (const Segment& s : segments) {
    if (s.end == s.begin) continue;
    const int64_t len = s.end - s.begin;
    jobs.push_back({out.narrow(0, s.begin, len), a.narrow(0, s.begin, len), b.select(0, s.group)});
  }
  matmul_many(jobs);
  return out;
}

at::Tensor m_grouped_bf16_gemm_masked_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& masked_m,
                                          std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] = grouped::masked_signature(a, b, masked_m, out_dtype);
  const std::vector<int64_t> mv = grouped::masked_rows(grouped::kMasked, masked_m, a.size(1));
  // Rows at or beyond masked_m[g] are not computed; they are written as zeros (only they are zeroed).
  at::Tensor out = at::empty(shape, a.options().dtype(out_t));
  std::vector<MatmulJob> jobs;
  for (int64_t g = 0; g < a.size(0); ++g) {
    if (mv[g] < a.size(1)) out.select(0, g).narrow(0, mv[g], a.size(1) - mv[g]).zero_();
    if (mv[g] == 0) continue;
    jobs.push_back({out.select(0, g).narrow(0, 0, mv[g]), a.select(0, g).narrow(0, 0, mv[g]), b.select(0, g)});
  }
  matmul_many(jobs);
  return out;
}

}  // namespace

at::Tensor k_grouped_bf16_gemm_into(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout,
                                    int64_t num_groups, bool psum, int64_t alignment,
                                    const std::optional<at::Tensor>& c, std::optional<at::ScalarType> out_dtype,
                                    const std::optional<at::Tensor>& into) {
  const auto [shape, out_t] = grouped::k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype);
  TORCH_CHECK(!into.has_value() || (into->sizes().equals(shape) && into->scalar_type() == out_t &&
                                    into->is_contiguous() && into->device() == a.device()),
              grouped::kKGrouped, ": internal error: the output buffer is not the result's contiguous shape and dtype");
  const std::vector<Segment> segments =
      grouped::layout_segments(grouped::kKGrouped, layout, psum, alignment, a.size(0), num_groups);
  const at::ScalarType acc_t = a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  // A reduced-precision result without c where no group has two runs of rows (the psum layout's case): each group's
  // GEMM writes its output directly, FP32 accumulation and one rounding inside the worker, as a loop of torch.mm
  // would; no [G, M, N] FP32 accumulator (its fresh pages alone cost more than the GEMMs in bench grouped).
  std::vector<int64_t> runs(num_groups, 0);
  for (const Segment& s : segments) runs[s.group] += s.end > s.begin;
  if (out_t != acc_t && !c.has_value() && std::all_of(runs.begin(), runs.end(), [](int64_t n) { return n <= 1; })) {
    at::Tensor out = into.has_value() ? *into : at::empty(shape, a.options().dtype(out_t));
    std::vector<MatmulJob> jobs;
    for (const Segment& s : segments) {
      if (s.end == s.begin) continue;
      const int64_t len = s.end - s.begin;
      jobs.push_back({out.select(0, s.group), a.narrow(0, s.begin, len).t(), b.narrow(0, s.begin, len).t()});
    }
    matmul_many(jobs);
    for (int64_t g = 0; g < num_groups; ++g) {
      if (!runs[g]) out.select(0, g).zero_();
    }
    return out;
  }
  // One accumulator for all segments of a group: a group split into several runs still rounds once.
  // A contiguous copy of c: the output's layout is the fake's (row-major), whatever c's strides are.
  at::Tensor acc = c.has_value() ? c->to(acc_t, false, /*copy=*/true, at::MemoryFormat::Contiguous)
                                 : at::empty(shape, a.options().dtype(acc_t));
  // Without c a group's first segment writes its accumulator (no zero-fill pass) and later ones add to it;
  // groups without rows are zeroed.
  // A group's runs add to one accumulator in order: round r holds every group's r-th run, and each round is one
  // matmul_many (one round unless a layout splits a group).
  std::vector<char> started(num_groups, c.has_value() ? 1 : 0);
  std::vector<std::vector<MatmulJob>> rounds;
  std::vector<int64_t> seen(num_groups, 0);
  for (const Segment& s : segments) {
    if (s.end == s.begin) continue;
    at::Tensor acc_g = acc.select(0, s.group);
    const int64_t len = s.end - s.begin;
    const std::optional<at::Tensor> prior = started[s.group] ? std::optional<at::Tensor>(acc_g) : std::nullopt;
    const size_t round = static_cast<size_t>(seen[s.group]++);
    if (rounds.size() <= round) rounds.resize(round + 1);
    rounds[round].push_back({acc_g, a.narrow(0, s.begin, len).t(), b.narrow(0, s.begin, len).t(), prior});
    started[s.group] = 1;
  }
  for (const std::vector<MatmulJob>& jobs : rounds) matmul_many(jobs);
  for (int64_t g = 0; g < num_groups; ++g) {
    if (!started[g]) acc.select(0, g).zero_();
  }
  if (into.has_value()) return into->copy_(acc);
  return acc.scalar_type() == out_t ? acc : acc.to(out_t);
}

namespace {

at::Tensor k_grouped_bf16_gemm_cpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& layout,
                                   int64_t num_groups, bool psum, int64_t alignment, const std::optional<at::Tensor>& c,
                                   std::optional<at::ScalarType> out_dtype) {
  return k_grouped_bf16_gemm_into(a, b, layout, num_groups, psum, alignment, c, out_dtype, std::nullopt);
}

at::Tensor m_grouped_fp8_gemm_cpu(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                  const at::Tensor& sfb, const at::Tensor& layout, bool psum, int64_t alignment,
                                  at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
                                  std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] =
      grouped::m_grouped_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype);
  const auto segments = grouped::layout_segments(grouped::kMGroupedFp8, layout, psum, alignment, a.size(0), b.size(0));
  at::Tensor out = at::empty(shape, a.options().dtype(out_t));
  // The segments' rows are zeroed, accumulated and rounded by their own tasks, in the call's one parallel region.
  zero_unowned_rows(out, segments);
  fp8_products_into(out, at::Tensor(), [&](const at::Tensor& acc) {
    std::vector<Fp8Job> jobs;
    for (const Segment& s : segments) {
      if (s.end == s.begin) continue;
      const int64_t len = s.end - s.begin;
      jobs.push_back({acc.narrow(0, s.begin, len), a.narrow(0, s.begin, len), sfa.narrow(0, s.begin, len),
                      b.select(0, s.group), sfb.select(0, s.group), recipe_a.vec(), recipe_b.vec()});
    }
    return jobs;
  });
  return out;
}

at::Tensor m_grouped_fp8_gemm_masked_cpu(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                         const at::Tensor& sfb, const at::Tensor& masked_m, at::IntArrayRef recipe_a,
                                         at::IntArrayRef recipe_b, std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] = grouped::masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype);
  const std::vector<int64_t> mv = grouped::masked_rows(grouped::kMaskedFp8, masked_m, a.size(1));
  // Rows at or beyond masked_m[g] are written as zeros; the others are zeroed, accumulated and rounded by their
  // own tasks, in the call's one parallel region.
  at::Tensor out = at::empty(shape, a.options().dtype(out_t));
  for (int64_t g = 0; g < a.size(0); ++g) {
    if (mv[g] < a.size(1)) out.select(0, g).narrow(0, mv[g], a.size(1) - mv[g]).zero_();
  }
  fp8_products_into(out, at::Tensor(), [&](const at::Tensor& acc) {
    std::vector<Fp8Job> jobs;
    for (int64_t g = 0; g < a.size(0); ++g) {
      if (mv[g] == 0) continue;
      jobs.push_back({acc.select(0, g).narrow(0, 0, mv[g]), a.select(0, g).narrow(0, 0, mv[g]),
                      sfa.select(0, g).narrow(0, 0, mv[g]), b.select(0, g), sfb.select(0, g), recipe_a.vec(),
                      recipe_b.vec()});
    }
    return jobs;
  });
  return out;
}

// Training path of FP8 experts: x cast per token (1 x block), each expert's weight in block x block blocks
// (DeepSeek-V3's recipe), then the scaled segments; high-precision inputs, output in x's dtype.
at::Tensor m_grouped_fp8_linear_cpu(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& layout, bool psum,
                                    int64_t alignment, int64_t block, bool use_ue8m0, bool fp8_backward) {
  const std::vector<int64_t> shape =
      grouped::m_grouped_fp8_linear_signature(x, weight, layout, psum, alignment, block);
  const auto segments =
      grouped::layout_segments(grouped::kLinearFp8, layout, psum, alignment, x.size(0), weight.size(0));
  at::Tensor out = at::empty(shape, x.options());
  if (out.numel() == 0) return out;
  const auto [xq, xs] = quantize_blocks(x, 1, block, use_ue8m0);
  std::vector<std::pair<at::Tensor, at::Tensor>> experts(weight.size(0));
  for (const Segment& s : segments) {
    auto& w = experts[s.group];
    if (s.end > s.begin && !w.first.defined()) w = quantize_blocks(weight.select(0, s.group), block, block, use_ue8m0);
  }
  // Every segment's GEMM in the call's one parallel region, each zeroing and rounding its own rows.
  zero_unowned_rows(out, segments);
  fp8_products_into(out, at::Tensor(), [&](const at::Tensor& acc) {
    std::vector<Fp8Job> jobs;
    for (const Segment& s : segments) {
      if (s.end == s.begin) continue;
      const int64_t len = s.end - s.begin;
      const auto& w = experts[s.group];
      jobs.push_back({acc.narrow(0, s.begin, len), xq.narrow(0, s.begin, len), xs.narrow(0, s.begin, len), w.first,
                      w.second, {1, block}, {block, block}});
    }
    return jobs;
  });
  return out;
}

// The per-token cast inside the grouped GEMM: each expert segment's rows cast 1 x gran_k (quantize_blocks, bit for
// bit quantize_fp8's) right before its GEMM, so the FP8 copy in memory is one segment's, never all of x's, and rows
// no expert owns (alignment padding, possibly uninitialized) are never read.
at::Tensor m_grouped_fp8_quant_gemm_cpu(const at::Tensor& x, const at::Tensor& b, const at::Tensor& sfb,
                                        const at::Tensor& layout, bool psum, int64_t alignment, int64_t gran_k,
                                        at::IntArrayRef recipe_b, bool use_ue8m0,
                                        std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] =
      grouped::m_grouped_fp8_quant_signature(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, out_dtype);
  const auto segments = grouped::layout_segments(grouped::kQuantFp8, layout, psum, alignment, x.size(0), b.size(0));
  const std::array<int64_t, 2> recipe_a{1, gran_k};
  return with_fp32_accumulator(shape, out_t, at::Tensor(), x.options(), [&](at::Tensor& acc) {
    for (const Segment& s : segments) {
      if (s.end == s.begin) continue;
      const int64_t len = s.end - s.begin;
      const auto [q, sf] = quantize_blocks(x.narrow(0, s.begin, len), 1, gran_k, use_ue8m0);
      at::Tensor rows = acc.narrow(0, s.begin, len);
      fp8_gemm_accumulate(rows, q, sf, b.select(0, s.group), sfb.select(0, s.group), recipe_a, recipe_b, 1.0);
    }
  });
}

// FP32 [len, MN] = x[rows] * sf[scale rows] with one scale row per gran_k rows of the group (the group's
// own K blocks: the last may be partial).
at::Tensor dequantize_k_block(const at::Tensor& x, const at::Tensor& sf, int64_t begin, int64_t len, int64_t sf_row,
                              int64_t gran_k) {
  const int64_t blocks = (len + gran_k - 1) / gran_k;
  const at::Tensor scales = sf.narrow(0, sf_row, blocks).to(at::kFloat).repeat_interleave(gran_k, 0).narrow(0, 0, len);
  return x.narrow(0, begin, len).to(at::kFloat).mul_(scales);
}

// Weight gradients in FP8: D[g] = C[g] + deq(A)[rows_g]^T deq(B)[rows_g], A [S, M] and B [S, N] FP8 with
// per-channel scales along the grouped axis: each group's ceil(k_g / gran_k) scale rows follow each other.
at::Tensor k_grouped_fp8_gemm_cpu(const at::Tensor& a, const at::Tensor& sfa, const at::Tensor& b,
                                  const at::Tensor& sfb, const at::Tensor& layout, int64_t num_groups,
                                  int64_t alignment, int64_t gran_k, const std::optional<at::Tensor>& c,
                                  std::optional<at::ScalarType> out_dtype) {
  const auto [shape, out_t] =
      grouped::k_grouped_fp8_signature(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype);
  const auto segments = grouped::k_fp8_segments(a, sfa, sfb, layout, num_groups, alignment, gran_k);
  return with_fp32_accumulator(shape, out_t, c.value_or(at::Tensor()), a.options(), [&](at::Tensor& acc) {
    int64_t sf_row = 0;
    for (const Segment& s : segments) {
      const int64_t len = s.end - s.begin;
      if (len == 0) continue;
      const at::Tensor a_deq = dequantize_k_block(a, sfa, s.begin, len, sf_row, gran_k);
      const at::Tensor b_deq = dequantize_k_block(b, sfb, s.begin, len, sf_row, gran_k);
      acc.select(0, s.group).addmm_(a_deq.t(), b_deq);
      sf_row += (len + gran_k - 1) / gran_k;
    }
  });
}


// ---- m_grouped_bf16_gemm_swiglu: the expert MLP's first GEMM with its SwiGLU(-quant) epilogue ----
// One task per (expert segment, column tile): the tile's gate rows and up rows of B are converted once and
// multiplied with the segment's rows in blocks; each [rows, 2 x tile] FP32 block is rounded to a's dtype (the
// L1 output the unfused pipeline stores), then gated, weighted and rounded (or quantized) straight into the
// output. No [M, 2I] intermediate exists; the epilogue runs ATen's own kernels (silu, clamp, the casts), so it
// matches the unfused composition element for element.

constexpr int64_t kSwigluRowBlock = 256;
// FP32 elements of B per task (gate + up rows of one column tile): about 1 MiB, L2-resident across row blocks.
constexpr int64_t kSwigluTileElements = int64_t{1} << 18;

struct SwigluEpilogue {
  const std::optional<at::Tensor>& row_weights;
  std::optional<double> clamp;
  int64_t gran;  // 0: rounded output, else FP8 with 1 x gran scales
  bool ue8m0;
  at::ScalarType compute_t;
  at::Tensor out, sf;

  // h [rows, 2w]: the L1 output's gate columns [j0, j0 + w) then its up columns, for rows [r0, r0 + rows).
  void operator()(const at::Tensor& h, int64_t r0, int64_t j0, int64_t w) const {
    (*this)(h.narrow(1, 0, w), h.narrow(1, w, w), r0, j0, w);
  }

  // The same with the gate and up columns [rows, w] as two tensors.
  void operator()(const at::Tensor& gate_h, const at::Tensor& up_h, int64_t r0, int64_t j0, int64_t w) const {
    const int64_t rows = gate_h.size(0);
    at::Tensor gate = gate_h.to(compute_t), up = up_h.to(compute_t);
    if (clamp.has_value()) {
      gate = gate.clamp_max(*clamp);
      up = up.clamp(-*clamp, *clamp);
    }
    at::Tensor act = at::silu(gate);
    const bool fused = row_weights.has_value() && act.scalar_type() == at::kFloat && up.scalar_type() == at::kFloat &&
                       row_weights->scalar_type() == at::kFloat && act.is_contiguous() && up.is_contiguous();
    if (fused) {  // the product and the row's weight in one pass (rows.h times_up: the same two roundings)
      const int64_t cols = act.size(1), w_stride = row_weights->stride(0);
      const float* wp = row_weights->const_data_ptr<float>() + r0 * w_stride;
      float* a = act.data_ptr<float>();
      const float* u = up.const_data_ptr<float>();
      for (int64_t r = 0; r < rows; ++r) times_up(a + r * cols, u + r * cols, cols, true, wp[r * w_stride]);
    } else {
      act.mul_(up);
      if (row_weights.has_value()) act.mul_(row_weights->narrow(0, r0, rows).unsqueeze(1));
    }
    at::Tensor out_tile = out.narrow(0, r0, rows).narrow(1, j0, w);
    if (gran == 0) {
      out_tile.copy_(act);
      return;
    }
    const auto [q, scales] = quantize_blocks(act, 1, gran, ue8m0);
    out_tile.copy_(q);
    sf.narrow(0, r0, rows).narrow(1, j0 / gran, scales.size(1)).copy_(scales);
  }

  // The epilogue of an [M, I] output (FP8 with its [M, ceil(I / gran)] FP32 scales where gran > 0, else [M, 0]).
  static SwigluEpilogue make(const std::optional<at::Tensor>& row_weights, std::optional<double> clamp, int64_t gran,
                             bool ue8m0, at::ScalarType compute_t, at::ScalarType out_t, int64_t M, int64_t I,
                             const at::TensorOptions& options) {
    const int64_t scale_cols = gran > 0 ? (I + gran - 1) / gran : 0;
    return {row_weights,
            clamp,
            gran,
            ue8m0,
            compute_t,
            at::empty({M, I}, options.dtype(out_t)),
            at::empty({M, scale_cols}, options.dtype(at::kFloat))};
  }
};

struct SwigluTask {
  int64_t group, begin, end, j0, w;  // group -1: rows no group owns (their L1 output is zero)
};

// Column tiles of the L1 output's I columns: multiples of `unit` (a quantization group never straddles two tasks),
// `tile` sized for the cache, `stream` for few-row segments (which stream B once whatever the tile: as wide as the
// threads allow, since many narrow GEMM calls cost more than the work); both narrowed until every thread has work.
struct SwigluTiles {
  int64_t tile, stream;
};

SwigluTiles swiglu_tiles(int64_t I, int64_t K, int64_t unit, size_t segments) {
  const auto round_up = [](int64_t x, int64_t m) { return (x + m - 1) / m * m; };
  const int64_t tile = round_up(std::max<int64_t>(1, kSwigluTileElements / (2 * std::max<int64_t>(K, 1))), unit);
  const int64_t busy = std::max<int64_t>(1, static_cast<int64_t>(segments));
  const int64_t tiles_wanted = (2 * at::get_num_threads() + busy - 1) / busy;
  const int64_t parallel_tile = round_up((I + tiles_wanted - 1) / tiles_wanted, unit);
  const int64_t whole = round_up(I, unit);
  return {std::min({tile, parallel_tile, whole}), std::min(parallel_tile, whole)};
}

// One task per (segment, column tile of width `width(segment)`), then one per run of rows no group owns (the
// epilogue of a zero L1 output, full width).
template <typename Width>
std::vector<SwigluTask> swiglu_tasks(const std::vector<Segment>& segments, int64_t M, int64_t I, Width width) {
  std::vector<SwigluTask> tasks;
  std::vector<char> owned(M, 0);
  for (const Segment& s : segments) {
    std::fill(owned.begin() + s.begin, owned.begin() + s.end, 1);
    if (s.end == s.begin) continue;
    const int64_t w = width(s);
    for (int64_t j0 = 0; j0 < I; j0 += w) tasks.push_back({s.group, s.begin, s.end, j0, std::min(w, I - j0)});
  }
  for (int64_t r = 0; r < M;) {
    if (owned[r]) {
      ++r;
      continue;
    }
    int64_t e = r;
    while (e < M && !owned[e]) ++e;
    tasks.push_back({-1, r, e, 0, I});
    r = e;
  }
  return tasks;
}

// The epilogue of rows no group owns: h = 0, in row blocks.
void swiglu_unowned(const SwigluEpilogue& epilogue, const SwigluTask& task, at::ScalarType h_t,
                    const at::TensorOptions& options) {
  for (int64_t r0 = task.begin; r0 < task.end; r0 += kSwigluRowBlock) {
    const int64_t rows = std::min(kSwigluRowBlock, task.end - r0);
    epilogue(at::zeros({rows, 2 * task.w}, options.dtype(h_t)), r0, task.j0, task.w);
  }
}

}  // namespace

// m_grouped_bf16_gemm_swiglu's work on checked arguments (grouped.h).
std::tuple<at::Tensor, at::Tensor> bf16_swiglu_segments(const at::Tensor& a, const int64_t* source, int64_t M,
                                                        const at::Tensor& scanned, const at::Tensor& b,
                                                        const std::vector<Segment>& segments,
                                                        const std::optional<at::Tensor>& row_weights,
                                                        std::optional<double> activation_clamp, int64_t quant_gran_k,
                                                        bool use_ue8m0, at::ScalarType out_t) {
  const at::ScalarType compute_t = a.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  const int64_t K = a.size(1), I = b.size(1) / 2;
  const SwigluEpilogue epilogue = SwigluEpilogue::make(row_weights, activation_clamp, quant_gran_k, use_ue8m0,
                                                       compute_t, out_t, M, I, a.options());
  if (M == 0 || I == 0) return {epilogue.out, epilogue.sf};

  const SwigluTiles tiles = swiglu_tiles(I, K, quant_gran_k > 0 ? quant_gran_k : 16, segments.size());
  const at::ScalarType h_t = a.scalar_type();
  // BF16 on a CPU with BF16 dot products, every product normal: ATen's BF16 GEMM per tile (see below).
  const bool native_tiles = h_t == at::kBFloat16 && native_bf16_dot() && bf16_products_normal(scanned, b);
  // Few-row segments stream B once, and ATen's BF16 GEMM reads B in place (no tile to keep in cache).
  const int64_t few_rows = few_rows_max();
  const auto tasks = swiglu_tasks(segments, M, I, [&](const Segment& s) {
    return native_tiles || s.end - s.begin <= few_rows ? tiles.stream : tiles.tile;
  });

  // Rows [r0, r0 + n) of the L1 input: a view of a, or the gathered copy of a's rows source[r0..] (contiguous, the
  // same values and shape, so the same GEMM calls and bits as on a permuted copy).
  const auto rows_of = [&](int64_t r0, int64_t n) {
    if (source == nullptr) return a.narrow(0, r0, n);
    at::Tensor rows = at::empty({n, K}, a.options());
    const int64_t bytes = K * static_cast<int64_t>(a.element_size()), ld = a.stride(0) * a.element_size();
    const char* src = static_cast<const char*>(a.const_data_ptr());
    char* dst = static_cast<char*>(rows.data_ptr());
    for (int64_t r = 0; r < n; ++r) std::memcpy(dst + r * bytes, src + source[r0 + r] * ld, bytes);
    return rows;
  };
  const at::Tensor a_acc = native_tiles || source != nullptr ? a : a.to(compute_t);
  // Tasks taken one at a time (tasks.h): a thread slowed by a busy core holds up one tile, not a static share.
  parallel_tasks(static_cast<int64_t>(tasks.size()), at::get_num_threads(), [&](int64_t t) {
    const SwigluTask& task = tasks[t];
    if (task.group < 0) {
      swiglu_unowned(epilogue, task, h_t, a.options());
      return;
    }
    const at::Tensor bg = b.select(0, task.group);
    if (task.end - task.begin <= few_rows) {
      // Few rows: memory-bound on B, which matmul_into's row or streaming kernel reads once in BF16 (no FP32 copy
      // of the tile; on the row kernel the same bits as m_grouped_bf16_gemm's rows).
      const at::Tensor rows = rows_of(task.begin, task.end - task.begin);
      at::Tensor h = at::empty({rows.size(0), 2 * task.w}, a.options().dtype(h_t));
      at::Tensor gate = h.narrow(1, 0, task.w), up = h.narrow(1, task.w, task.w);
      matmul_into(gate, rows, bg.narrow(0, task.j0, task.w), std::nullopt, 1.0);
      matmul_into(up, rows, bg.narrow(0, I + task.j0, task.w), std::nullopt, 1.0);
      epilogue(h, task.begin, task.j0, task.w);
      return;
    }
    if (native_tiles) {
      // BF16 on a CPU with BF16 dot products: ATen's BF16 GEMM gives the rounded L1 output directly (FP32
      // accumulation, one rounding: the definition), 2-4x faster than SGEMM on an FP32 copy of the tile. It
      // reads the gate and up rows of B in place (a transposed view, as F.linear): no copy of the tile, which at
      // few rows per expert would cost more than the GEMM.
      const at::Tensor b_gate = bg.narrow(0, task.j0, task.w).t(), b_up = bg.narrow(0, I + task.j0, task.w).t();
      for (int64_t r0 = task.begin; r0 < task.end; r0 += kSwigluRowBlock) {
        const at::Tensor rows = rows_of(r0, std::min(kSwigluRowBlock, task.end - r0));
        epilogue(at::mm(rows, b_gate), at::mm(rows, b_up), r0, task.j0, task.w);
      }
      return;
    }
    at::Tensor bt = at::empty({2 * task.w, K}, a.options().dtype(compute_t));
    bt.narrow(0, 0, task.w).copy_(bg.narrow(0, task.j0, task.w));
    bt.narrow(0, task.w, task.w).copy_(bg.narrow(0, I + task.j0, task.w));
    for (int64_t r0 = task.begin; r0 < task.end; r0 += kSwigluRowBlock) {
      const int64_t rows = std::min(kSwigluRowBlock, task.end - r0);
      const at::Tensor a_rows = source == nullptr ? a_acc.narrow(0, r0, rows) : rows_of(r0, rows).to(compute_t);
      // FP32 accumulation (FP64 for FP64), then the one rounding of the L1 output.
      epilogue(at::mm(a_rows, bt.t()).to(h_t), r0, task.j0, task.w);
    }
  });
  return {epilogue.out, epilogue.sf};
}

namespace {

std::tuple<at::Tensor, at::Tensor> m_grouped_bf16_gemm_swiglu_cpu(
    const at::Tensor& a_in, const at::Tensor& b_in, const at::Tensor& layout, bool psum, int64_t alignment,
    const std::optional<at::Tensor>& weights_in, std::optional<double> activation_clamp, int64_t quant_gran_k,
    bool use_ue8m0, std::optional<at::ScalarType> out_dtype) {
  // The tasks run ATen ops on worker threads, which do not inherit the caller's "below autograd" dispatch state:
  // detached operands keep them from recording (or refusing, for out= ops) autograd history.
  const at::Tensor a = a_in.detach(), b = b_in.detach();
  const std::optional<at::Tensor> row_weights =
      weights_in.has_value() ? std::optional<at::Tensor>(weights_in->detach()) : std::nullopt;
  const at::ScalarType out_t = grouped::swiglu_signature(a, b, layout, psum, alignment, row_weights, activation_clamp,
                                                         quant_gran_k, use_ue8m0, out_dtype);
  const auto segments = grouped::layout_segments(grouped::kSwiglu, layout, psum, alignment, a.size(0), b.size(0));
  return bf16_swiglu_segments(a, nullptr, a.size(0), a, b, segments, row_weights, activation_clamp, quant_gran_k,
                              use_ue8m0, out_t);
}

// ---- m_grouped_fp8_gemm_swiglu: the same with FP8 (or packed FP4) L1 operands ----
// h = bf16(deq(A) @ deq(B)^T) (the L1 output m_grouped_fp8_gemm writes), then the same epilogue. Tasks as above:
// each many-row task decodes its gate and up rows of B to FP32 once (scale rows found by absolute row, so a tile
// need not start on a scale block) and runs SGEMM per row block; few-row segments take the FP8 GEMM's streaming
// kernel (B decoded in registers, read once) on the tile's rows of B and of its scales.

std::tuple<at::Tensor, at::Tensor> m_grouped_fp8_gemm_swiglu_cpu(
    const at::Tensor& a_in, const at::Tensor& sfa_in, const at::Tensor& b_in, const at::Tensor& sfb_in,
    const at::Tensor& layout, bool psum, int64_t alignment, at::IntArrayRef recipe_a, at::IntArrayRef recipe_b,
    const std::optional<at::Tensor>& weights_in, std::optional<double> activation_clamp, int64_t quant_gran_k,
    bool use_ue8m0, std::optional<at::ScalarType> out_dtype) {
  // Detached for the worker threads, as in m_grouped_bf16_gemm_swiglu_cpu.
  const at::Tensor a = a_in.detach(), sfa = sfa_in.detach(), b = b_in.detach(), sfb = sfb_in.detach();
  const std::optional<at::Tensor> row_weights =
      weights_in.has_value() ? std::optional<at::Tensor>(weights_in->detach()) : std::nullopt;
  const at::ScalarType out_t =
      grouped::swiglu_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, row_weights,
                                    activation_clamp, quant_gran_k, use_ue8m0, out_dtype);

  const int64_t M = a.size(0), K = logical_k(a), I = b.size(1) / 2;
  const SwigluEpilogue epilogue = SwigluEpilogue::make(row_weights, activation_clamp, quant_gran_k, use_ue8m0,
                                                       at::kFloat, out_t, M, I, a.options());
  const auto segments = grouped::layout_segments(grouped::kSwigluFp8, layout, psum, alignment, M, b.size(0));
  if (M == 0 || I == 0) return {epilogue.out, epilogue.sf};

  const int64_t gran_n = recipe_b[0];
  const int64_t unit = quant_gran_k > 0 ? quant_gran_k : 16;
  const SwigluTiles tiles = swiglu_tiles(I, K, unit, segments.size());
  // The streaming kernel takes B's scales as whole blocks of gran_n rows: its tiles start on block boundaries (the
  // up half too, so I must be whole blocks), else one task covers all 2I columns.
  const int64_t stream_unit = std::lcm(unit, gran_n);
  const int64_t stream_width =
      I % gran_n == 0 ? std::min(I, std::max(stream_unit, tiles.stream / stream_unit * stream_unit)) : I;
  // (Many-row tasks as wide as the threads allow, decoding A once instead of I / tile times, measured no faster on
  // the MoE layer of bench compile: 250 vs 241 ms, 21 interleaved runs.)
  const auto tasks = swiglu_tasks(segments, M, I, [&](const Segment& s) {
    return s.end - s.begin <= kStreamingMaxRows ? stream_width : tiles.tile;
  });

  // Tasks taken one at a time (tasks.h): a thread slowed by a busy core holds up one tile, not a static share.
  parallel_tasks(static_cast<int64_t>(tasks.size()), at::get_num_threads(), [&](int64_t t) {
    const SwigluTask& task = tasks[t];
    if (task.group < 0) {
      swiglu_unowned(epilogue, task, at::kBFloat16, a.options());
      return;
    }
    const at::Tensor bg = b.select(0, task.group), sg = sfb.select(0, task.group);
    const int64_t len = task.end - task.begin;
    if (len <= kStreamingMaxRows) {
      // m_grouped_fp8_gemm's own path for these rows (streaming, or dequantized panels where scales overflow).
      const at::Tensor rows = a.narrow(0, task.begin, len), row_sf = sfa.narrow(0, task.begin, len);
      at::Tensor acc = at::zeros({len, 2 * task.w}, a.options().dtype(at::kFloat));
      if (task.w == I) {
        fp8_gemm_accumulate(acc, rows, row_sf, bg, sg, recipe_a, recipe_b, 1.0);
      } else {
        const int64_t blocks = (task.w + gran_n - 1) / gran_n;
        for (const int64_t half : {int64_t{0}, I}) {
          at::Tensor part = acc.narrow(1, half == 0 ? 0 : task.w, task.w);
          fp8_gemm_accumulate(part, rows, row_sf, bg.narrow(0, half + task.j0, task.w),
                              sg.narrow(0, (half + task.j0) / gran_n, blocks), recipe_a, recipe_b, 1.0);
        }
      }
      epilogue(acc.to(at::kBFloat16), task.begin, task.j0, task.w);
      return;
    }
    // The tile's gate rows then its up rows of B, decoded to FP32 once (each half in place): one GEMM per row
    // block, its A rows and FP32 product in buffers the task reuses.
    at::Tensor bt = at::empty({2 * task.w, K}, a.options().dtype(at::kFloat));
    for (const int64_t half : {int64_t{0}, int64_t{1}}) {
      at::Tensor rows_of_half = bt.narrow(0, half * task.w, task.w);
      dequantize_rows_into(rows_of_half, bg, sg, gran_n, recipe_b[1], half * I + task.j0);
    }
    const int64_t block = std::min(kSwigluRowBlock, len);
    const at::Tensor a_buf = at::empty({block, K}, a.options().dtype(at::kFloat));
    const at::Tensor h_buf = at::empty({block, 2 * task.w}, a.options().dtype(at::kFloat));
    for (int64_t r0 = task.begin; r0 < task.end; r0 += kSwigluRowBlock) {
      const int64_t rows = std::min(kSwigluRowBlock, task.end - r0);
      at::Tensor a_deq = a_buf.narrow(0, 0, rows), h = h_buf.narrow(0, 0, rows);
      dequantize_rows_into(a_deq, a, sfa, 1, recipe_a[1], r0);
      // FP32 accumulation, then the one rounding of the L1 output to BF16.
      epilogue(at::mm_out(h, a_deq, bt.t()).to(at::kBFloat16), r0, task.j0, task.w);
    }
  });
  return {epilogue.out, epilogue.sf};
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- grouped family: MoE grouped GEMMs over expert segments (specs/deepgemm_api.md §4-6) ----
  // layout: psum=True -> int32 [G] cumulative group ends (torch._grouped_mm's offs), group g spans rows
  // [align(end_{g-1}, alignment), end_g); psum=False -> int32 [rows] group id per row, -1 = padding.
  // Rows outside every group are zeros in the output.
  m.set_python_module("torch_ascend_moe.fakes.grouped");
  // D[i] = A[i] @ B[group(i)]^T: A [M, K], B [G, N, K] (any majorness) -> D [M, N].
  m.def(
      "m_grouped_bf16_gemm(Tensor a, Tensor b, Tensor layout, bool psum=True, int alignment=1, "
      "ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // D[g, i] = A[g, i] @ B[g]^T for i < masked_m[g]; rows at or beyond masked_m[g] are zeros.
  m.def(
      "m_grouped_bf16_gemm_masked(Tensor a, Tensor b, Tensor masked_m, ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // D[g] = C[g] + sum over rows s of group g of A[s]^T B[s]: A [S, M], B [S, N] -> D [G, M, N] (weight grads).
  m.def(
      "k_grouped_bf16_gemm(Tensor a, Tensor b, Tensor layout, int num_groups, bool psum=True, int alignment=1, "
      "Tensor? c=None, ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // The experts' first GEMM with its SwiGLU epilogue: h = round(A[i] @ B[g(i)]^T) in a's dtype (B [G, 2I, K], gate
  // rows then up rows), act = silu(gate) * up (* row_weights[i]) in FP32 (FP64 for FP64), gate clamped to <= c and
  // up to [-c, c] first; out [M, I] rounded to out_dtype, or FP8 E4M3 with 1 x quant_gran_k scales [M, ceil(I /
  // quant_gran_k)] (power-of-two with use_ue8m0); the scales are [M, 0] without quantization. Rows no group owns
  // go through the epilogue with h = 0.
  m.def(
      "m_grouped_bf16_gemm_swiglu(Tensor a, Tensor b, Tensor layout, bool psum=True, int alignment=1, "
      "Tensor? row_weights=None, float? activation_clamp=None, int quant_gran_k=0, bool use_ue8m0=False, "
      "ScalarType? out_dtype=None) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});

  // Scaled variants (operands and scales as in fp8_gemm; A scales per row, recipe_a = [1, gran_k]).
  m.def(
      "m_grouped_fp8_gemm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor layout, bool psum=True, "
      "int alignment=1, int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // m_grouped_bf16_gemm_swiglu with a scaled L1 (operands and scales as m_grouped_fp8_gemm): h =
  // bf16(deq(A)[i] @ deq(B)[g(i)]^T), B [G, 2I, K]; the same epilogue (FP32, row_weights FP32); out BF16 (default)
  // or FP32, or FP8 E4M3 with 1 x quant_gran_k scales.
  m.def(
      "m_grouped_fp8_gemm_swiglu(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor layout, bool psum=True, "
      "int alignment=1, int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], Tensor? row_weights=None, "
      "float? activation_clamp=None, int quant_gran_k=0, bool use_ue8m0=False, ScalarType? out_dtype=None) "
      "-> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "m_grouped_fp8_gemm_masked(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor masked_m, "
      "int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // The per-token cast feeding m_grouped_fp8_gemm, inside the op (inference FP8 experts on BF16/FP32 tokens):
  // x [M, K] cast 1 x gran_k (as quantize_fp8(x, [1, gran_k], use_ue8m0)), times the pre-quantized experts
  // (b, sfb) as m_grouped_fp8_gemm's; output x's dtype by default (BF16 or FP32). Straight-through gradient for x.
  m.def(
      "m_grouped_fp8_quant_gemm(Tensor x, Tensor b, Tensor sfb, Tensor layout, bool psum=True, int alignment=1, "
      "int gran_k=128, int[2] recipe_b=[128, 128], bool use_ue8m0=False, ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // FP8 experts for training: BF16/FP32 x [M, K] and weight [G, N, K] cast inside (x 1 x block per token,
  // weights block x block), straight-through gradients; fp8_backward picks an FP8 or input-precision dgrad.
  m.def(
      "m_grouped_fp8_linear(Tensor x, Tensor weight, Tensor layout, bool psum=True, int alignment=1, int block=128, "
      "bool use_ue8m0=False, bool fp8_backward=True) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // FP8 weight gradients: D[g] = C[g] + deq(A)[rows_g]^T deq(B)[rows_g] over a psum layout; A [S, M] and
  // B [S, N] FP8 with per-channel scales along S, each group's ceil(k_g / gran_k) scale rows in turn.
  m.def(
      "k_grouped_fp8_gemm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor layout, int num_groups, int alignment=1, "
      "int gran_k=128, Tensor? c=None, ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("m_grouped_bf16_gemm", &m_grouped_bf16_gemm_cpu);
  m.impl("m_grouped_bf16_gemm_masked", &m_grouped_bf16_gemm_masked_cpu);
  m.impl("m_grouped_bf16_gemm_swiglu", &m_grouped_bf16_gemm_swiglu_cpu);
  m.impl("k_grouped_bf16_gemm", &k_grouped_bf16_gemm_cpu);
  m.impl("m_grouped_fp8_gemm", &m_grouped_fp8_gemm_cpu);
  m.impl("m_grouped_fp8_gemm_masked", &m_grouped_fp8_gemm_masked_cpu);
  m.impl("m_grouped_fp8_gemm_swiglu", &m_grouped_fp8_gemm_swiglu_cpu);
  m.impl("m_grouped_fp8_linear", &m_grouped_fp8_linear_cpu);
  m.impl("m_grouped_fp8_quant_gemm", &m_grouped_fp8_quant_gemm_cpu);
  m.impl("k_grouped_fp8_gemm", &k_grouped_fp8_gemm_cpu);
}

}  // namespace ascend_moe
