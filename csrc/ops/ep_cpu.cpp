// The ep family's CPU helper kernels. The ep ops themselves are Python (torch_ascend_moe/backends/portable/ep.py:
// they call torch.distributed); these are the data-heavy steps those kernels call on CPU tensors, registered in
// the private namespace ascend_moe_kernels (not graph ops: no fakes, no autograd; the ep ops around them have).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "ep_checks.h"
#include "rows.h"

namespace ascend_moe {
namespace {

// out[t] = round(0 + bias_0[t] + bias_1[t] + rows[i_0] + rows[i_1] + ...) over the rows i with dest[i] == t in
// visiting order (default ascending i), accumulated in Acc; row i is found through `row` (rows arrive as blocks: this rank's own rows and
// each peer's, read where the transport left them). Rows arrive source-rank-major, so ascending i is ascending
// source rank: the combine's fixed order. Tokens are independent, so threads split tokens and the result is
// bitwise the same for any thread count. Converting row by row keeps no [rows, H] FP32 temporary (fresh pages
// cost more than the arithmetic here).
template <typename T, typename Acc>
void reduce_rows(const std::vector<const void*>& row, const std::vector<int64_t>& begin,
                 const std::vector<int64_t>& order, const c10::optional<at::Tensor>& bias_0,
                 const c10::optional<at::Tensor>& bias_1, at::Tensor& out) {
  const int64_t tokens = out.size(0), h = out.size(1);
  T* dst = out.mutable_data_ptr<T>();
  std::vector<at::Tensor> biases;
  for (const auto& b : {bias_0, bias_1}) {
    if (b.has_value()) biases.push_back(b->to(c10::CppTypeToScalarType<Acc>::value).contiguous());
  }
  at::parallel_for(0, tokens, 16, [&](int64_t lo, int64_t hi) {
    std::vector<Acc> acc(h);
    std::vector<const T*> rows;
    for (int64_t t = lo; t < hi; ++t) {
      std::fill(acc.begin(), acc.end(), Acc(0));
      for (const auto& b : biases) {
        const Acc* bp = b.const_data_ptr<Acc>() + t * h;
        add_rows<Acc, Acc>(acc.data(), &bp, nullptr, 1, h);
      }
      rows.clear();
      for (int64_t p = begin[t]; p < begin[t + 1]; ++p) rows.push_back(static_cast<const T*>(row[order[p]]));
      // The shared row-sum loop (rows.h): eight columns' sums in a register across all rows for BF16/FP32.
      add_rows<T, Acc>(acc.data(), rows.data(), nullptr, static_cast<int64_t>(rows.size()), h);
      store_row(acc.data(), h, dst + t * h);
    }
  });
}

at::Tensor& ep_combine_reduce_out_cpu(at::TensorList blocks, const at::Tensor& dest, int64_t num_tokens,
                                      const c10::optional<at::Tensor>& bias_0,
                                      const c10::optional<at::Tensor>& bias_1,
                                      const c10::optional<at::Tensor>& visit, at::Tensor& out) {
  const int64_t n = ep::combine_reduce_signature(blocks, dest, num_tokens, bias_0, bias_1, visit);
  const at::Tensor& first = blocks[0];
  const int64_t h = first.size(1);
  std::vector<const void*> row;
  for (const at::Tensor& rows : blocks) {
    const char* base = static_cast<const char*>(rows.const_data_ptr());
    const int64_t stride = rows.stride(0) * rows.element_size();
    for (int64_t i = 0; i < rows.size(0); ++i) row.push_back(base + i * stride);
  }
  // The rows in visiting order: ascending, or `visit` (a permutation: the order a token's copies add in).
  at::Tensor v;
  const int64_t* vp = nullptr;
  if (visit.has_value()) {
    ep::check_visit_values(*visit, n);
    v = visit->contiguous();
    vp = v.const_data_ptr<int64_t>();
  }
  ep::check_dest_values(dest, num_tokens);
  // A stable counting sort of the rows by destination token: begin[t] .. begin[t + 1] in visiting order.
  const at::Tensor d = dest.contiguous();
  const int64_t* dp = d.const_data_ptr<int64_t>();
  std::vector<int64_t> begin(num_tokens + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    if (dp[i] >= 0) ++begin[dp[i] + 1];
  }
  for (int64_t t = 0; t < num_tokens; ++t) begin[t + 1] += begin[t];
  std::vector<int64_t> order(begin[num_tokens]), fill(begin.begin(), begin.end() - 1);
  for (int64_t q = 0; q < n; ++q) {
    const int64_t i = vp ? vp[q] : q;
    if (dp[i] >= 0) order[fill[dp[i]]++] = i;
  }
  ep::check_reduce_out(out, first, num_tokens, h);
  switch (first.scalar_type()) {
    case at::kBFloat16:
      reduce_rows<c10::BFloat16, float>(row, begin, order, bias_0, bias_1, out);
      break;
    case at::kHalf:
      reduce_rows<c10::Half, float>(row, begin, order, bias_0, bias_1, out);
      break;
    case at::kFloat:
      reduce_rows<float, float>(row, begin, order, bias_0, bias_1, out);
      break;
    default:
      reduce_rows<double, double>(row, begin, order, bias_0, bias_1, out);
  }
  return out;
}

at::Tensor ep_combine_reduce_cpu(at::TensorList blocks, const at::Tensor& dest, int64_t num_tokens,
                                 const c10::optional<at::Tensor>& bias_0, const c10::optional<at::Tensor>& bias_1,
                                 const c10::optional<at::Tensor>& visit) {
  ep::combine_reduce_signature(blocks, dest, num_tokens, bias_0, bias_1, visit);  // before num_tokens sizes `out`
  const int64_t h = blocks[0].size(1);
  at::Tensor out = at::empty({num_tokens, h}, blocks[0].options().memory_format(at::MemoryFormat::Contiguous));
  return ep_combine_reduce_out_cpu(blocks, dest, num_tokens, bias_0, bias_1, visit, out);
}


// ---- dispatch: the send plan and the receive side's metadata, one pass each (CPU) ----
//
// The portable kernel (torch_ascend_moe/backends/portable/ep.py: _send_plan_portable, _unpack_portable) builds
// the same results from ~40 small tensor ops; on a CPU their fixed cost is most of a small dispatch. Bit for bit
// the same outputs (tested against each other).

template <typename I>
void sanitize_ids(const at::Tensor& topk_idx, int64_t num_experts, int64_t* out, int64_t& bad) {
  const int64_t t = topk_idx.size(0), k = topk_idx.size(1);
  const int64_t s0 = topk_idx.stride(0), s1 = topk_idx.stride(1);
  const I* p = topk_idx.const_data_ptr<I>();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t v = static_cast<int64_t>(p[i * s0 + j * s1]);
      const bool ok = v >= -1 && v < num_experts;
      bad += !ok;
      out[i * k + j] = ok ? v : -1;
    }
  }
}

// Row-wise bytes of `src` ([T, C], any strides) at byte `at` of each `width`-byte row of `dst`.
void put_rows(const at::Tensor& src, uint8_t* dst, int64_t width, int64_t at) {
  const at::Tensor c = src.contiguous();
  const int64_t n = c.size(0), bytes = c.size(1) * c.element_size();
  const auto* p = static_cast<const uint8_t*>(c.const_data_ptr());
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * width + at, p + i * bytes, bytes);
}

// (counts [R + 1]: tokens with an id on rank d, then the number of ids out of range, send_src: the token of each
// row sent, destination-major then ascending token (static: [R * T], -1 where the token has no expert on that
// rank), meta [T, W] uint8: each token's row of scales | ids (those outside [-1, E) as -1, int64) | weights | zero
// padding to 8 bytes | token index + 1 as int64).
std::tuple<at::Tensor, at::Tensor, at::Tensor> ep_dispatch_plan_cpu(
    const at::Tensor& topk_idx, int64_t num_experts, int64_t num_ranks, bool padded,
    const c10::optional<at::Tensor>& x_scales, const c10::optional<at::Tensor>& topk_weights) {
  ep::dispatch_plan_signature(topk_idx, num_experts, num_ranks, x_scales, topk_weights);
  const int64_t t = topk_idx.size(0), k = topk_idx.size(1), per_rank = num_experts / num_ranks;
  const auto long_opts = topk_idx.options().dtype(at::kLong);
  at::Tensor ids = at::empty({t, k}, long_opts);
  int64_t* id = ids.mutable_data_ptr<int64_t>();
  int64_t bad = 0;
  if (topk_idx.scalar_type() == at::kLong) {
    sanitize_ids<int64_t>(topk_idx, num_experts, id, bad);
  } else {
    sanitize_ids<int32_t>(topk_idx, num_experts, id, bad);
  }
  // in_rank[d * T + i]: token i has an expert on rank d (a token goes to a rank once, however many of its ids).
  std::vector<uint8_t> in_rank(num_ranks * t, 0);
  at::Tensor counts = at::zeros({num_ranks + 1}, long_opts);
  int64_t* c = counts.mutable_data_ptr<int64_t>();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t v = id[i * k + j];
      if (v < 0) continue;
      uint8_t& seen = in_rank[(v / per_rank) * t + i];
      c[v / per_rank] += !seen;
      seen = 1;
    }
  }
  c[num_ranks] = bad;
  int64_t rows = 0;
  for (int64_t d = 0; d < num_ranks; ++d) rows += c[d];
  at::Tensor send_src = at::empty({padded ? num_ranks * t : rows}, long_opts);
  int64_t* s = send_src.mutable_data_ptr<int64_t>();
  for (int64_t d = 0, q = 0; d < num_ranks; ++d) {
    for (int64_t i = 0; i < t; ++i) {
      if (in_rank[d * t + i]) {
        s[q++] = i;
      } else if (padded) {
        s[q++] = -1;
      }
    }
  }
  int64_t scale_bytes = 0;  // bytes per row, whatever T (0 rows still have a width)
  if (x_scales.has_value()) scale_bytes = x_scales->size(1) * x_scales->element_size();
  const int64_t weight_bytes = topk_weights.has_value() ? k * topk_weights->element_size() : 0;
  const int64_t used = scale_bytes + k * 8 + weight_bytes, width = used + (8 - used % 8) % 8 + 8;
  at::Tensor meta = at::empty({t, width}, topk_idx.options().dtype(at::kByte));
  uint8_t* m = meta.mutable_data_ptr<uint8_t>();
  if (scale_bytes) put_rows(*x_scales, m, width, 0);
  put_rows(ids, m, width, scale_bytes);
  if (weight_bytes) put_rows(*topk_weights, m, width, scale_bytes + k * 8);
  for (int64_t i = 0; i < t; ++i) {
    std::memset(m + i * width + used, 0, width - 8 - used);
    const int64_t tag = i + 1;
    std::memcpy(m + i * width + width - 8, &tag, 8);
  }
  return {counts, send_src, meta};
}

// The receive side of a dispatch's metadata rows (meta [N, W], as ep_dispatch_plan packed them; a row whose tag is
// 0 is padding): (scales [N, scale_bytes] uint8, recv_topk_idx [N, K]: the ids of this rank's experts as local
// ids, else -1, weights [N, K * weight_size] uint8: the weights of those slots, zero bytes on the others,
// per_expert [L] int32: slots per local expert rounded up to `alignment`, src [N]: each row's token index on its
// source rank, -1 on padding).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> ep_dispatch_unpack_cpu(
    const at::Tensor& meta, int64_t scale_bytes, int64_t k, int64_t weight_size, int64_t first_expert,
    int64_t local_experts, int64_t alignment) {
  ep::dispatch_unpack_signature(meta, scale_bytes, k, weight_size, local_experts, alignment);
  const int64_t used = scale_bytes + k * 8 + k * weight_size, width = used + (8 - used % 8) % 8 + 8;
  const at::Tensor rows = meta.contiguous();
  const uint8_t* m = rows.const_data_ptr<uint8_t>();
  const int64_t n = rows.size(0);
  const auto opts = meta.options();
  at::Tensor scales = at::empty({n, scale_bytes}, opts);
  at::Tensor ids = at::empty({n, k}, opts.dtype(at::kLong));
  at::Tensor weights = at::empty({n, k * weight_size}, opts);
  at::Tensor src = at::empty({n}, opts.dtype(at::kLong));
  std::vector<int64_t> slots(local_experts, 0);
  uint8_t* sp = scales.mutable_data_ptr<uint8_t>();
  int64_t* ip = ids.mutable_data_ptr<int64_t>();
  uint8_t* wp = weights.mutable_data_ptr<uint8_t>();
  int64_t* srcp = src.mutable_data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* row = m + i * width;
    int64_t tag;
    std::memcpy(&tag, row + width - 8, 8);
    const bool valid = tag > 0;
    srcp[i] = tag - 1;
    std::memcpy(sp + i * scale_bytes, row, scale_bytes);
    for (int64_t j = 0; j < k; ++j) {
      int64_t v;
      std::memcpy(&v, row + scale_bytes + j * 8, 8);
      const int64_t local = v - first_expert;
      const bool mine = valid && v >= 0 && local >= 0 && local < local_experts;
      ip[i * k + j] = mine ? local : -1;
      slots[mine ? local : 0] += mine;
      uint8_t* w = wp + (i * k + j) * weight_size;
      if (mine) {
        std::memcpy(w, row + scale_bytes + k * 8 + j * weight_size, weight_size);
      } else {
        std::memset(w, 0, weight_size);
      }
    }
  }
  at::Tensor per_expert = at::empty({local_experts}, opts.dtype(at::kInt));
  int32_t* pe = per_expert.mutable_data_ptr<int32_t>();
  for (int64_t e = 0; e < local_experts; ++e) {
    pe[e] = static_cast<int32_t>((slots[e] + alignment - 1) / alignment * alignment);
  }
  return {scales, ids, weights, per_expert, src};
}

// ---- DeepEP V2's handle fields (deep_ep.ElasticBuffer.dispatch's epilogue), one pass (CPU) ----
//
// The portable twin is torch_ascend_moe/deep_ep/buffers/elastic.py::_handle_fields_portable (~25 tensor ops);
// bitwise the same (tested against each other).

// recv_counts [R]: rows from each source; recv_gather [N]: each output row's receive-buffer row, -1 padding;
// recv_src_idx [N]: its token on the source; recv_topk_idx [N, K]: local ids or -1; topk_idx [T, K]: this rank's
// ids. Returns (psum_scaleup [su] int32: cumulative real rows per source scale-up index (ranks i::su), meta
// [N, K + 2] int32: (source rank * num_max + token, source rank * K + first local lane, -1...) or -1 on padding,
// unaligned [L] int32: slots per local expert, dst_slots [T, K] int32: each slot's row among those sent to its
// rank (padded: the token index), -1 for empty slots).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> elastic_handle_fields_cpu(
    const at::Tensor& recv_counts, const at::Tensor& recv_gather, const at::Tensor& recv_src_idx,
    const at::Tensor& recv_topk_idx, const at::Tensor& topk_idx, int64_t num_max, int64_t num_scaleup_ranks,
    int64_t local_experts, bool padded) {
  ep::handle_fields_signature(recv_counts, recv_topk_idx, topk_idx, num_scaleup_ranks, local_experts);
  const int64_t r = recv_counts.numel(), n = recv_gather.numel(), k = recv_topk_idx.size(1);
  const at::Tensor counts = recv_counts.to(at::kLong).contiguous(), gather = recv_gather.to(at::kLong).contiguous();
  const at::Tensor src_idx = recv_src_idx.to(at::kLong).contiguous();
  const at::Tensor ids = recv_topk_idx.to(at::kLong).contiguous(), sent = topk_idx.to(at::kLong).contiguous();
  const int64_t* cp = counts.const_data_ptr<int64_t>();
  const int64_t* gp = gather.const_data_ptr<int64_t>();
  const int64_t* sp = src_idx.const_data_ptr<int64_t>();
  const int64_t* ip = ids.const_data_ptr<int64_t>();
  std::vector<int64_t> ends(r);
  for (int64_t s = 0, sum = 0; s < r; ++s) ends[s] = sum += cp[s];
  const auto opts = recv_topk_idx.options().dtype(at::kInt);
  at::Tensor meta = at::empty({n, k + 2}, opts);
  int32_t* mp = meta.mutable_data_ptr<int32_t>();
  std::vector<int64_t> per_source(r, 0), unaligned(local_experts, 0);
  for (int64_t j = 0; j < n; ++j) {
    int32_t* row = mp + j * (k + 2);
    std::fill(row, row + k + 2, -1);
    int64_t first_lane = -1;
    for (int64_t l = 0; l < k; ++l) {
      const int64_t e = ip[j * k + l];
      if (e >= 0) {
        if (first_lane < 0) first_lane = l;
        if (e < local_experts) ++unaligned[e];
      }
    }
    if (gp[j] < 0) continue;
    // The source of receive-buffer row g: the first whose cumulative count exceeds g (the last for rows past
    // the end, as searchsorted + clamp does).
    const int64_t after = std::upper_bound(ends.begin(), ends.end(), gp[j]) - ends.begin();
    const int64_t src = std::min<int64_t>(after, r - 1);
    ++per_source[src];
    row[0] = static_cast<int32_t>(src * num_max + sp[j]);
    row[1] = static_cast<int32_t>(src * k + std::max<int64_t>(first_lane, 0));
  }
  at::Tensor psum = at::empty({num_scaleup_ranks}, opts);
  int32_t* pp = psum.mutable_data_ptr<int32_t>();
  for (int64_t i = 0, sum = 0; i < num_scaleup_ranks; ++i) {
    for (int64_t s = i; s < r; s += num_scaleup_ranks) sum += per_source[s];
    pp[i] = static_cast<int32_t>(sum);
  }
  at::Tensor unaligned_t = at::empty({local_experts}, opts);
  for (int64_t e = 0; e < local_experts; ++e) unaligned_t.mutable_data_ptr<int32_t>()[e] = unaligned[e];
  // dst_slots: per destination rank, a running count of the tokens going there (a token counts once).
  const int64_t t = sent.size(0), tk = sent.size(1);
  const int64_t* tp = sent.const_data_ptr<int64_t>();
  at::Tensor slots = at::empty({t, tk}, opts);
  int32_t* dp = slots.mutable_data_ptr<int32_t>();
  std::vector<int64_t> seen(r, 0), mark(r, -1);
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t l = 0; l < tk; ++l) {
      const int64_t v = tp[i * tk + l];
      const int64_t owner = v >= 0 ? v / local_experts : -1;
      if (owner >= 0 && owner < r && mark[owner] != i) {
        mark[owner] = i;
        ++seen[owner];
      }
    }
    for (int64_t l = 0; l < tk; ++l) {
      const int64_t v = tp[i * tk + l];
      const int64_t owner = v >= 0 ? v / local_experts : -1;
      dp[i * tk + l] = owner >= 0 && owner < r ? static_cast<int32_t>(padded ? i : seen[owner] - 1) : -1;
    }
  }
  return {psum, meta, unaligned_t, slots};
}

}  // namespace
}  // namespace ascend_moe

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- ep family: expert-parallel dispatch / combine over torch.distributed (specs/deepep_api.md §3-§5) ----
  // Kernels are device-generic Python (torch.distributed moves the data); `group_name` names the process group.
  m.set_python_module("torch_ascend_moe.fakes.ep");
  // (num_tokens_per_rank [R], num_tokens_per_node [max(1, R / ranks_per_node)], num_tokens_per_expert [E],
  //  is_token_in_rank [T, R]): DeepEP's get_dispatch_layout, purely local.
  m.def(
      "ep_dispatch_layout(Tensor topk_idx, int num_experts, int num_ranks, int ranks_per_node=8) "
      "-> (Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // One row per (token, destination rank), received source-rank-major then by ascending source token.
  // Returns (recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert, num_recv,
  // the handle: send_src, send_counts, recv_counts, recv_gather, and recv_src_idx: each row's token index on
  // its source rank, -1 for padding; DeepEP's recv_src_idx / V2's global token id), then backend_state: 1-D int32,
  // the routing state of the transport that moved the rows (DeepEP's handle, which our handle cannot rebuild: its
  // send_head is written inside DeepEP's kernel), empty when our own transport moved them; the cached dispatch and
  // the combine take it back. num_worst_tokens > 0: that many rows (static shapes, padding rows zero / -1); 0:
  // exactly the received rows (a data-dependent size).
  m.def(
      "ep_dispatch(Tensor x, Tensor? x_scales, Tensor topk_idx, Tensor? topk_weights, int num_experts, "
      "str group_name, int expert_alignment=1, int num_worst_tokens=0, float timeout_s=300.0) "
      "-> (Tensor recv_x, Tensor recv_x_scales, Tensor recv_topk_idx, Tensor recv_topk_weights, "
      "Tensor num_recv_tokens_per_expert, Tensor num_recv, Tensor send_src, Tensor send_counts, "
      "Tensor recv_counts, Tensor recv_gather, Tensor recv_src_idx, Tensor backend_state)",
      {at::Tag::pt2_compliant_tag});
  // Replays a dispatch's routing (its handle) with new rows: (recv_x, recv_x_scales).
  m.def(
      "ep_dispatch_cached(Tensor x, Tensor? x_scales, Tensor send_src, Tensor send_counts, Tensor recv_counts, "
      "Tensor recv_gather, str group_name, float timeout_s=300.0, Tensor? backend_state=None) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // combined[t] = round(bias_0[t] + bias_1[t] + sum over the ranks t went to, ascending, of x_r[row of t]) in FP32;
  // unweighted, as DeepEP's normal combine. copy_order [T, R] (optional): sum token t's copy from rank r in
  // ascending copy_order[t, r] instead (DeepEP V2 sums in top-k slot order). Returns (combined_x [T, H],
  // combined_topk_weights [T, K]).
  m.def(
      "ep_combine(Tensor x, Tensor? topk_weights, Tensor? bias_0, Tensor? bias_1, Tensor send_src, "
      "Tensor send_counts, Tensor recv_counts, Tensor recv_gather, int num_tokens, str group_name, "
      "float timeout_s=300.0, Tensor? copy_order=None, Tensor? backend_state=None) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // DeepEP V2's GEMM-ready expanded layout (do_expand), purely local: one row per (received row, local expert
  // it selected), grouped by local expert; expert e's block starts where block e - 1 ends, aligned up to
  // expert_alignment, and holds its rows in receive order, then zero padding (the m-grouped GEMMs' psum layout).
  // Returns (expanded_x [M, H], expanded_x_scales [M, S], expanded_weights [M] (0 on padding), expand_rows [N, K]
  // (each slot's expanded row, -1), psum [L] (block start + real count, V2's psum_num_recv_tokens_per_expert),
  // counts [L] (real rows per expert)). num_rows > 0: exactly that many rows (static; must hold the layout);
  // 0: exactly sum(align(counts, expert_alignment)) rows (a data-dependent size).
  m.def(
      "ep_expand(Tensor x, Tensor? x_scales, Tensor topk_idx, Tensor? topk_weights, int num_local_experts, "
      "int expert_alignment=1, int num_rows=0) -> (Tensor expanded_x, Tensor expanded_x_scales, "
      "Tensor expanded_weights, Tensor expand_rows, Tensor psum, Tensor counts)",
      {at::Tag::pt2_compliant_tag});
  // Low-latency mode: one message per (token, valid slot) into fixed [L, R * T_max, H] per-local-expert buffers,
  // rows [0, recv_count[i]) valid (ours: source-rank-major then ascending token; DeepEP's kernels: arrival order,
  // src_info / layout_range say where each row came from), the rest unspecified. Optional FP8 cast per 128 channels
  // (DeepEP's: round_scale = power-of-two scales, use_ue8m0 = their exponent bytes packed 4 per int32);
  // slot_weights scales each (token, slot) message (the combine's backward). Returns (recv_x, recv_x_scales,
  // recv_count [L], src_info [L, R * T_max], layout_range [L, R]: (begin << 32) | count per source,
  // backend_state: int32, empty unless the device's transport keeps routing state its combine needs (Ascend's
  // MC2: assist_info_for_combine and the row map), an opaque value to hand to the combine).
  m.def(
      "ep_low_latency_dispatch(Tensor x, Tensor topk_idx, int num_max_dispatch_tokens_per_rank, int num_experts, "
      "str group_name, bool use_fp8=True, bool round_scale=False, bool use_ue8m0=False, Tensor? slot_weights=None, "
      "float timeout_s=300.0) -> (Tensor recv_x, Tensor recv_x_scales, Tensor recv_count, Tensor src_info, "
      "Tensor layout_range, Tensor backend_state)",
      {at::Tag::pt2_compliant_tag});
  // combined[t] = round(sum over valid slots k, in order, of topk_weights[t, k] * y_k(t)) in FP32: weighted.
  // backend_state: the dispatch's (optional: src_info and layout_range alone define the result on every device).
  m.def(
      "ep_low_latency_combine(Tensor x, Tensor topk_idx, Tensor topk_weights, Tensor src_info, Tensor layout_range, "
      "int num_max_dispatch_tokens_per_rank, str group_name, float timeout_s=300.0, Tensor? backend_state=None) "
      "-> Tensor",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY(ascend_moe_kernels, m) {
  // rows: blocks whose rows, one block after another, are the rows dest indexes.
  // visit: the order the rows are visited in (default ascending): a token's copies add in that order.
  m.def(
      "ep_combine_reduce(Tensor[] rows, Tensor dest, int num_tokens, Tensor? bias_0=None, Tensor? bias_1=None, "
      "Tensor? visit=None) -> Tensor");
  m.def(
      "ep_combine_reduce.out(Tensor[] rows, Tensor dest, int num_tokens, Tensor? bias_0=None, Tensor? bias_1=None, "
      "Tensor? visit=None, *, Tensor(a!) out) -> Tensor(a!)");
  m.def(
      "ep_dispatch_plan(Tensor topk_idx, int num_experts, int num_ranks, bool padded, Tensor? x_scales, "
      "Tensor? topk_weights) -> (Tensor, Tensor, Tensor)");
  m.def(
      "ep_dispatch_unpack(Tensor meta, int scale_bytes, int k, int weight_size, int first_expert, "
      "int local_experts, int alignment) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def(
      "elastic_handle_fields(Tensor recv_counts, Tensor recv_gather, Tensor recv_src_idx, Tensor recv_topk_idx, "
      "Tensor topk_idx, int num_max, int num_scaleup_ranks, int local_experts, bool padded) "
      "-> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(ascend_moe_kernels, CPU, m) {
  m.impl("ep_combine_reduce", &ascend_moe::ep_combine_reduce_cpu);
  m.impl("ep_combine_reduce.out", &ascend_moe::ep_combine_reduce_out_cpu);
  m.impl("ep_dispatch_plan", &ascend_moe::ep_dispatch_plan_cpu);
  m.impl("ep_dispatch_unpack", &ascend_moe::ep_dispatch_unpack_cpu);
  m.impl("elastic_handle_fields", &ascend_moe::elastic_handle_fields_cpu);
}
