// The sparse_mla family's argument checks (sparse_mla_prefill). Twin: torch_ascend_moe/checks/sparse_mla.py (the
// same checks in the same order, the same words; tests/test_validation_twins.py compares them; sparse_mla_decode has
// no C++ kernel, so its own checks are Python's alone).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "checks.h"

namespace ascend_moe::sparse_mla {

constexpr const char* kPrefill = "ascend_moe::sparse_mla_prefill";

// Where the logits, the softmax and the weighted sum are computed (and lse / max_logits are returned).
inline at::ScalarType accumulator(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

inline void check_same_device_as_q(const char* op, const char* arg, const at::Tensor& t, const at::Tensor& q) {
  AM_CHECK_ARG(t.device() == q.device(), op, arg, "device", q.device().str() + " (same as 'q')", t.device().str());
}

// int32, one per `per` (q's dim 0).
inline void check_lengths(const char* op, const char* arg, const at::Tensor& lengths, const at::Tensor& q,
                          const char* per, const char* layout) {
  check_rank(op, arg, lengths, 1, layout);
  AM_CHECK_ARG(lengths.scalar_type() == at::kInt, op, arg, "dtype", "torch.int32", dtype_name(lengths.scalar_type()));
  check_same_device_as_q(op, arg, lengths, q);
  check_dim_size(op, arg, lengths, 0, per, q.size(0), "q.size(0)");
}

// attn_sink [h_q] (q's dim heads_dim) in the accumulation dtype; topk_length int32, one per `per` (q's dim 0).
inline void check_sink_and_lengths(const char* op, const at::Tensor& q, at::ScalarType acc,
                                   const std::optional<at::Tensor>& attn_sink, int64_t heads_dim,
                                   const std::optional<at::Tensor>& topk_length, const char* per, const char* layout) {
  if (attn_sink.has_value()) {
    const at::Tensor& s = *attn_sink;
    check_rank(op, "attn_sink", s, 1, "[h_q]");
    AM_CHECK_ARG(s.scalar_type() == acc, op, "attn_sink", "dtype", dtype_name(acc), dtype_name(s.scalar_type()));
    check_same_device_as_q(op, "attn_sink", s, q);
    check_dim_size(op, "attn_sink", s, 0, "h_q", q.size(heads_dim), "q.size(" + std::to_string(heads_dim) + ")");
  }
  if (topk_length.has_value()) check_lengths(op, "topk_length", *topk_length, q, per, layout);
}

// Checks a sparse_mla_prefill call; returns the accumulation dtype.
inline at::ScalarType sparse_mla_prefill_signature(const at::Tensor& q, const at::Tensor& kv, const at::Tensor& indices,
                                                   int64_t d_v, const std::optional<at::Tensor>& attn_sink,
                                                   const std::optional<at::Tensor>& topk_length) {
  const char* op = kPrefill;
  check_rank(op, "q", q, 3, "[s_q, h_q, d_qk]");
  AM_CHECK_ARG(is_gemm_dtype(q.scalar_type()), op, "q", "dtype", kGemmDtypes, dtype_name(q.scalar_type()));
  check_rank(op, "kv", kv, 3, "[s_kv, h_kv, d_qk]");
  AM_CHECK_ARG(kv.scalar_type() == q.scalar_type(), op, "kv", "dtype", dtype_name(q.scalar_type()) + " (same as 'q')",
               dtype_name(kv.scalar_type()));
  check_same_device_as_q(op, "kv", kv, q);
  check_dim_size(op, "kv", kv, 1, "h_kv", 1, "one KV head");
  check_dim_size(op, "kv", kv, 2, "d_qk", q.size(2), "q.size(2)");
  check_rank(op, "indices", indices, 3, "[s_q, h_kv, topk]");
  AM_CHECK_ARG(indices.scalar_type() == at::kInt, op, "indices", "dtype", "torch.int32",
               dtype_name(indices.scalar_type()));
  check_same_device_as_q(op, "indices", indices, q);
  check_dim_size(op, "indices", indices, 0, "s_q", q.size(0), "q.size(0)");
  check_dim_size(op, "indices", indices, 1, "h_kv", 1, "kv.size(1)");
  check_int_arg(op, "d_v", d_v, 1);
  AM_CHECK_ARG(d_v <= q.size(2), op, "d_v", "value", "at most d_qk = " + std::to_string(q.size(2)), d_v);
  const at::ScalarType acc = accumulator(q.scalar_type());
  check_sink_and_lengths(op, q, acc, attn_sink, 1, topk_length, "s_q", "[s_q]");
  return acc;
}

}  // namespace ascend_moe::sparse_mla
