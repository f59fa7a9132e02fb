// CPU kernel of the sparse_mla family: FlashMLA's sparse attention (specs/flashmla_api.md §3; the op's
// definition is in torch_ascend_moe/meta/sparse_mla.py, the portable kernel beside it computes the same).
//
// Parallel over query tokens. For each token: its valid KV rows (index in [0, s_kv), position < topk_length)
// are read in place and converted to FP32 (FP64 for FP64) into a per-thread buffer, logits = q_i · Kᵀ and
// out = softmax · V are two small SGEMMs on that buffer, the softmax in between in FP32. Memory: one token's
// rows per thread; nothing of size [s_q, s_kv] or [s_q, topk, d] exists.
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <optional>
#include <tuple>
#include <vector>

#include "sparse_mla_checks.h"

namespace ascend_moe {
namespace {

// torch.logaddexp's value: equal infinities stay, NaN propagates.
template <typename acc_t>
acc_t logaddexp(acc_t a, acc_t b) {
  if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<acc_t>::quiet_NaN();
  if (std::isinf(a) && a == b) return a;
  const acc_t hi = std::max(a, b);
  return hi + std::log1p(std::exp(-std::abs(a - b)));
}

template <typename scalar_t>
void prefill(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, double sm_scale, int64_t d_v,
             const std::optional<at::Tensor>& attn_sink, const std::optional<at::Tensor>& topk_length,
             at::Tensor& out, at::Tensor& max_logits, at::Tensor& lse) {
  using acc_t = at::opmath_type<scalar_t>;
  const int64_t s_q = q.size(0), h = q.size(1), d = q.size(2), s_kv = kv.size(0), topk = indices.size(2);
  const auto qa = q.accessor<scalar_t, 3>();
  const auto kva = kv.accessor<scalar_t, 3>();
  const auto ia = indices.accessor<int32_t, 3>();
  std::optional<at::TensorAccessor<acc_t, 1>> sink;
  std::optional<at::TensorAccessor<int32_t, 1>> length;
  if (attn_sink.has_value()) sink.emplace(attn_sink->accessor<acc_t, 1>());
  if (topk_length.has_value()) length.emplace(topk_length->accessor<int32_t, 1>());
  auto oa = out.accessor<scalar_t, 3>();
  auto ma = max_logits.accessor<acc_t, 2>();
  auto la = lse.accessor<acc_t, 2>();
  const auto acc_options = at::TensorOptions().dtype(c10::CppTypeToScalarType<acc_t>::value);
  const acc_t scale = static_cast<acc_t>(sm_scale);
  constexpr acc_t kInf = std::numeric_limits<acc_t>::infinity();

  at::parallel_for(0, s_q, 1, [&](int64_t lo, int64_t hi) {
    at::Tensor keys = at::empty({std::max<int64_t>(topk, 1), d}, acc_options);
    at::Tensor query = at::empty({h, d}, acc_options);
    std::vector<int64_t> rows;
    rows.reserve(topk);
    for (int64_t i = lo; i < hi; ++i) {
      rows.clear();
      const int64_t positions = length.has_value() ? std::min<int64_t>(std::max<int64_t>((*length)[i], 0), topk)
                                                   : topk;
      for (int64_t j = 0; j < positions; ++j) {
        const int64_t index = ia[i][0][j];
        if (index >= 0 && index < s_kv) rows.push_back(index);
      }
      const int64_t n = static_cast<int64_t>(rows.size());
      if (n == 0) {  // no row: FlashMLA's kernel writes out 0, lse +inf, max_logits -inf
        for (int64_t hh = 0; hh < h; ++hh) {
          for (int64_t c = 0; c < d_v; ++c) oa[i][hh][c] = scalar_t(0);
          ma[i][hh] = -kInf;
          la[i][hh] = kInf;
        }
        continue;
      }
      acc_t* kp = keys.data_ptr<acc_t>();
      for (int64_t r = 0; r < n; ++r) {
        const auto row = kva[rows[r]][0];
        for (int64_t c = 0; c < d; ++c) kp[r * d + c] = static_cast<acc_t>(row[c]);
      }
      acc_t* qp = query.data_ptr<acc_t>();
      for (int64_t hh = 0; hh < h; ++hh) {
        for (int64_t c = 0; c < d; ++c) qp[hh * d + c] = static_cast<acc_t>(qa[i][hh][c]);
      }
      const at::Tensor k = keys.narrow(0, 0, n);
      at::Tensor p = at::mm(query, k.t());  // [h, n] logits, then softmax weights in place
      acc_t* pp = p.data_ptr<acc_t>();
      for (int64_t hh = 0; hh < h; ++hh) {
        acc_t* s = pp + hh * n;
        acc_t m = -kInf;
        for (int64_t j = 0; j < n; ++j) {
          s[j] *= scale;
          if (std::isnan(s[j]) || s[j] > m || std::isnan(m)) m = std::isnan(m) ? m : s[j];
        }
        const acc_t shift = std::isinf(m) ? acc_t(0) : m;  // torch.logsumexp's guard for infinite maxima
        acc_t sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - shift);
        const acc_t row_lse = std::log(sum) + shift;
        const acc_t norm = sink.has_value() ? logaddexp<acc_t>(row_lse, (*sink)[hh]) : row_lse;
        for (int64_t j = 0; j < n; ++j) s[j] = s[j] == -kInf ? acc_t(0) : std::exp(s[j] - norm);
        ma[i][hh] = m;
        la[i][hh] = row_lse;
      }
      const at::Tensor o = at::mm(p, k.narrow(1, 0, d_v));  // [h, d_v]
      const acc_t* op = o.data_ptr<acc_t>();
      for (int64_t hh = 0; hh < h; ++hh) {
        for (int64_t c = 0; c < d_v; ++c) oa[i][hh][c] = static_cast<scalar_t>(op[hh * d_v + c]);
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_mla_prefill_cpu(
    const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices, double sm_scale, int64_t d_v,
    const std::optional<at::Tensor>& attn_sink, const std::optional<at::Tensor>& topk_length) {
  const at::ScalarType acc = sparse_mla::sparse_mla_prefill_signature(q, kv, indices, d_v, attn_sink, topk_length);
  at::Tensor out = at::empty({q.size(0), q.size(1), d_v}, q.options());
  at::Tensor max_logits = at::empty({q.size(0), q.size(1)}, q.options().dtype(acc));
  at::Tensor lse = at::empty({q.size(0), q.size(1)}, q.options().dtype(acc));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, q.scalar_type(), "sparse_mla_prefill", [&] {
    prefill<scalar_t>(q, kv, indices, sm_scale, d_v, attn_sink, topk_length, out, max_logits, lse);
  });
  return {out, max_logits, lse};
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- sparse_mla family: attention of each query over its own top-k KV rows (flash_mla_sparse_fwd):
  // (out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q], natural log) ----
  m.set_python_module("torch_ascend_moe.fakes.sparse_mla");
  m.def(
      "sparse_mla_prefill(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v=512, "
      "Tensor? attn_sink=None, Tensor? topk_length=None) -> (Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // Sparse decode over paged FP8/FP4 KV caches (flash_mla_with_kvcache's sparse mode; the extra cache shares
  // the softmax): (out [b, s_q, h_q, d_v], lse [b, h_q, s_q]). Python kernel (the portable one).
  m.def(
      "sparse_mla_decode(Tensor q, Tensor k_cache, Tensor indices, float sm_scale, int d_v=512, "
      "Tensor? attn_sink=None, Tensor? topk_length=None, Tensor? extra_k_cache=None, "
      "Tensor? extra_indices=None, Tensor? extra_topk_length=None) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) { m.impl("sparse_mla_prefill", &sparse_mla_prefill_cpu); }

}  // namespace ascend_moe
