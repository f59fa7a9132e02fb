// The mqa_logits family's argument checks (mqa_logits and its backward, the paged decode and its schedule metadata,
// mqa_topk, mqa_logits_topk and the two sparse indexers). Twin: torch_ascend_moe/checks/mqa_logits.py (the same
// checks in the same order, the same words; tests/test_validation_twins.py compares them).
//
// The check_*_values functions read tensor values (ranges, lengths, block ids): a fake cannot, so under
// torch.compile they fire when the compiled graph runs the kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "checks.h"
#include "fp8_gemm.h"

namespace ascend_moe::mqa_logits {

constexpr const char* kOp = "ascend_moe::mqa_logits";
constexpr const char* kBackward = "ascend_moe::mqa_logits_backward";
constexpr const char* kPaged = "ascend_moe::paged_mqa_logits";
constexpr const char* kMetadata = "ascend_moe::paged_mqa_logits_metadata";
constexpr const char* kTopk = "ascend_moe::mqa_topk";
constexpr const char* kFused = "ascend_moe::mqa_logits_topk";
constexpr const char* kSparse = "ascend_moe::sparse_mqa_logits";
constexpr const char* kPagedSparse = "ascend_moe::paged_sparse_mqa_logits";
// A paged cache's bytes per token, per layout.
constexpr const char* kAscendRowBytes = "D + D/32 (FP8) or D/2 + D/32 (FP4) with D % 64 == 0";
constexpr const char* kDeepGemmRowBytes = "D + 4 (FP8) or D/2 + 4 (FP4, D % 32 == 0 and D <= 128)";

inline bool is_quantized(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat8_e4m3fn || t.scalar_type() == at::kByte;
}

inline bool is_float_operand(at::ScalarType t) { return t == at::kBFloat16 || t == at::kFloat || t == at::kDouble; }

// The computation dtype of an (q, k) pair: FP64 for FP64 operands, else FP32.
inline at::ScalarType acc_dtype(const at::Tensor& q) {
  return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

inline std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.const_data_ptr<int64_t>(), c.const_data_ptr<int64_t>() + c.numel());
}

inline void check_same_device_as(const char* op, const char* arg, const at::Tensor& t, const at::Tensor& ref,
                                 const char* ref_name = "q") {
  AM_CHECK_ARG(t.device() == ref.device(), op, arg, "device", ref.device().str() + " (same as '" + ref_name + "')",
               t.device().str());
}

// One q or k operand and its optional scales; returns the scale block size g (D for one scale per row).
inline int64_t check_operand(const char* op, const char* name, const char* sf_name, const at::Tensor& x,
                             const std::optional<at::Tensor>& sf, int64_t rank, const char* layout,
                             const at::Tensor& ref) {
  check_rank(op, name, x, rank, layout);
  const at::ScalarType t = x.scalar_type();
  AM_CHECK_ARG(is_float_operand(t) || is_quantized(x), op, name, "dtype",
               "torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn or torch.uint8 (packed FP4)",
               dtype_name(t));
  check_same_device_as(op, name, x, ref);
  const int64_t D = logical_k(x);
  if (!is_quantized(x)) {
    AM_CHECK_ARG(!sf.has_value(), op, sf_name, "value", "None for a " + dtype_name(t) + " operand", "a tensor");
    return D;
  }
  if (!sf.has_value()) {
    AM_CHECK_ARG(!is_fp4(x), op, sf_name, "value", "scales for a packed FP4 operand", "None");
    return D;
  }
  check_scale_dtype(op, sf_name, *sf);
  check_same_device_as(op, sf_name, *sf, ref);
  const auto lead = x.sizes().slice(0, x.dim() - 1);
  const bool lead_ok = sf->dim() == rank && std::equal(lead.begin(), lead.end(), sf->sizes().begin());
  const int64_t nb = sf->dim() == rank ? sf->size(-1) : 0;
  const std::string lead_text = shape_str(lead);
  AM_CHECK_ARG(lead_ok && nb > 0 && D % nb == 0, op, sf_name, "shape",
               lead_text.substr(0, lead_text.size() - 1) + ", D / g] with g dividing D=" + std::to_string(D),
               shape_str(sf->sizes()));
  return D / nb;
}

// q and k are both high precision (one dtype) or both quantized (FP8 and FP4 may mix).
inline void check_pairing(const char* op, const at::Tensor& q, const at::Tensor& k) {
  if (is_quantized(q)) {
    AM_CHECK_ARG(is_quantized(k), op, "k", "dtype", "torch.float8_e4m3fn or torch.uint8 (packed FP4), as 'q' is",
                 dtype_name(k.scalar_type()));
  } else {
    AM_CHECK_ARG(k.scalar_type() == q.scalar_type(), op, "k", "dtype", dtype_name(q.scalar_type()) + " (same as 'q')",
                 dtype_name(k.scalar_type()));
  }
  AM_CHECK_ARG(logical_k(k) == logical_k(q), op, "k", "head dim (D)", std::to_string(logical_k(q)) + " (q's D)",
               logical_k(k));
}

// weights [rows, H]; returns the logits dtype (default: the weights' dtype).
inline at::ScalarType check_weights(const char* op, const at::Tensor& w, const at::Tensor& q, int64_t rows, int64_t H,
                                    const char* rows_what, std::optional<at::ScalarType> logits_dtype) {
  check_rank(op, "weights", w, 2, "[rows, H]");
  const bool fp64 = q.scalar_type() == at::kDouble;
  if (fp64) {
    AM_CHECK_ARG(w.scalar_type() == at::kDouble, op, "weights", "dtype", "torch.float64 (with float64 q)",
                 dtype_name(w.scalar_type()));
  } else {
    AM_CHECK_ARG(w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16, op, "weights", "dtype",
                 "torch.float32 or torch.bfloat16", dtype_name(w.scalar_type()));
  }
  check_same_device_as(op, "weights", w, q);
  AM_CHECK_ARG(w.size(0) == rows && w.size(1) == H, op, "weights", "shape",
               shape_str({rows, H}) + " (" + rows_what + ", H)", shape_str(w.sizes()));
  const at::ScalarType out_t = logits_dtype.value_or(w.scalar_type());
  if (fp64) {
    AM_CHECK_ARG(out_t == at::kDouble, op, "logits_dtype", "value", "torch.float64 (with float64 q)",
                 dtype_name(out_t));
  } else if (w.scalar_type() == at::kBFloat16) {
    AM_CHECK_ARG(out_t == at::kBFloat16, op, "logits_dtype", "value", "torch.bfloat16 (with BF16 weights)",
                 dtype_name(out_t));
  } else {
    AM_CHECK_ARG(out_t == at::kFloat || out_t == at::kBFloat16, op, "logits_dtype", "value",
                 "torch.float32 or torch.bfloat16", dtype_name(out_t));
  }
  return out_t;
}

inline void check_index_vector(const char* op, const char* name, const at::Tensor& t, int64_t length,
                               const at::Tensor& ref, const char* ref_name = "q") {
  check_rank(op, name, t, 1, "[S] (one per query)");
  AM_CHECK_ARG(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, name, "dtype",
               "torch.int32 or torch.int64", dtype_name(t.scalar_type()));
  check_same_device_as(op, name, t, ref, ref_name);
  check_dim_size(op, name, t, 0, "S", length, std::string(ref_name) + ".size(0)");
}

struct MqaShapes {
  int64_t S, H, D, S_kv, gq, gk;
  at::ScalarType out_t;
};

// Checks an mqa_logits call (or another op's part that is one, under `op`).
inline MqaShapes mqa_signature(const char* op, const at::Tensor& q, const std::optional<at::Tensor>& q_sf,
                               const at::Tensor& k, const std::optional<at::Tensor>& k_sf, const at::Tensor& weights,
                               const at::Tensor& ks, const at::Tensor& ke, int64_t max_seqlen_k,
                               std::optional<at::ScalarType> logits_dtype = std::nullopt) {
  const int64_t gq = check_operand(op, "q", "q_sf", q, q_sf, 3, "[S, H, D] (or [S, H, D/2] packed FP4)", q);
  const int64_t gk = check_operand(op, "k", "k_sf", k, k_sf, 2, "[S_kv, D] (or [S_kv, D/2] packed FP4)", q);
  check_pairing(op, q, k);
  const int64_t S = q.size(0), H = q.size(1), D = logical_k(q);
  AM_CHECK_ARG(H > 0 && D > 0, op, "q", "shape", "H > 0 heads of D > 0", shape_str(q.sizes()));
  const at::ScalarType out_t = check_weights(op, weights, q, S, H, "S", logits_dtype);
  check_index_vector(op, "ks", ks, S, q);
  check_index_vector(op, "ke", ke, S, q);
  AM_CHECK_ARG(max_seqlen_k >= 0, op, "max_seqlen_k", "value", "0 (full [S, S_kv] logits) or positive (compressed)",
               max_seqlen_k);
  AM_CHECK_ARG(max_seqlen_k <= kMaxIntArg, op, "max_seqlen_k", "value",
               "at most 2147483647 (integer arguments are int32-sized)", max_seqlen_k);
  return {S, H, D, k.size(0), gq, gk, out_t};
}

// 0 <= ks[i] <= ke[i] <= S_kv (and ke - ks <= max_seqlen_k when compressed), on the data.
inline void check_range_values(const char* op, const std::vector<int64_t>& ks, const std::vector<int64_t>& ke,
                               int64_t S_kv, int64_t max_seqlen_k) {
  for (size_t i = 0; i < ks.size(); ++i) {
    AM_CHECK_ARG(ks[i] >= 0 && ks[i] <= ke[i], op, "ks", "values", "0 <= ks[i] <= ke[i]",
                 "ks[" + std::to_string(i) + "]=" + std::to_string(ks[i]) + ", ke[" + std::to_string(i) +
                     "]=" + std::to_string(ke[i]));
    AM_CHECK_ARG(ke[i] <= S_kv, op, "ke", "values", "ke[i] <= S_kv=" + std::to_string(S_kv) + " (k.size(0))",
                 "ke[" + std::to_string(i) + "]=" + std::to_string(ke[i]));
    if (max_seqlen_k > 0) {
      AM_CHECK_ARG(ke[i] - ks[i] <= max_seqlen_k, op, "max_seqlen_k", "value",
                   "at least ke[i] - ks[i] for every query (compressed logits)",
                   std::to_string(max_seqlen_k) + " < ke[" + std::to_string(i) + "] - ks[" + std::to_string(i) +
                       "]=" + std::to_string(ke[i] - ks[i]));
    }
  }
}

// Checks an mqa_logits_backward call.
inline MqaShapes backward_signature(const at::Tensor& grad, const at::Tensor& q, const std::optional<at::Tensor>& q_sf,
                                    const at::Tensor& k, const std::optional<at::Tensor>& k_sf,
                                    const at::Tensor& weights, const at::Tensor& ks, const at::Tensor& ke,
                                    int64_t max_seqlen_k) {
  const MqaShapes sh = mqa_signature(kBackward, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k);
  const int64_t cols = max_seqlen_k > 0 ? max_seqlen_k : sh.S_kv;
  check_rank(kBackward, "grad", grad, 2, "[S, columns] (the logits' gradient)");
  AM_CHECK_ARG(grad.size(0) == sh.S && grad.size(1) == cols, kBackward, "grad", "shape",
               shape_str({sh.S, cols}) + " (the logits' shape)", shape_str(grad.sizes()));
  AM_CHECK_ARG(is_float_operand(grad.scalar_type()), kBackward, "grad", "dtype",
               "torch.bfloat16, torch.float32 or torch.float64", dtype_name(grad.scalar_type()));
  return sh;
}

// ---- paged decode ----

// Per-token scale bytes of a cache block: DeepGEMM stores 4 (FP8: one FP32; FP4: four UE8M0 codes, one per
// 32 values), the Ascend fused page layout D / 32 (one UE8M0 code per 32 values, int16-packed in pairs).
struct CacheFormat {
  int64_t block_kv, data_bytes, sf_bytes, block_stride;
  bool fp4, fp32_scale;
};

// The cache's byte layout: per block, block_kv token rows of data, then block_kv scale rows.
inline CacheFormat check_cache(const char* op, const at::Tensor& cache, int64_t D, bool ascend, const at::Tensor& q) {
  check_rank(op, "kv_cache", cache, 4, "[num_blocks, block_kv, 1, bytes per token] (uint8)");
  AM_CHECK_ARG(cache.scalar_type() == at::kByte, op, "kv_cache", "dtype", "torch.uint8",
               dtype_name(cache.scalar_type()));
  check_same_device_as(op, "kv_cache", cache, q);
  const int64_t row = cache.size(3);
  const int64_t sf_bytes = ascend ? D / 32 : 4;
  const bool fp8 = row == D + sf_bytes, fp4 = row == D / 2 + sf_bytes;
  const bool d_ok = ascend ? D % 64 == 0 : (D % 2 == 0 && (fp8 || (D % 32 == 0 && D <= 128)));
  AM_CHECK_ARG(d_ok && (fp8 || fp4), op, "kv_cache", "size(3) (bytes per token)",
               (ascend ? kAscendRowBytes : kDeepGemmRowBytes) + std::string(" for D=") + std::to_string(D), row);
  AM_CHECK_ARG(cache.size(2) == 1, op, "kv_cache", "size(2) (KV heads)", 1, cache.size(2));
  AM_CHECK_ARG(cache.stride(3) == 1 && cache.stride(1) == row, op, "kv_cache", "strides (1, 3)",
               "(" + std::to_string(row) + ", 1): token rows packed in each block",
               "(" + std::to_string(cache.stride(1)) + ", " + std::to_string(cache.stride(3)) + ")");
  const int64_t block_kv = cache.size(1);
  AM_CHECK_ARG(cache.size(0) <= 1 || cache.stride(0) >= block_kv * row, op, "kv_cache", "stride(0)",
               "at least block_kv * bytes per token = " + std::to_string(block_kv * row), cache.stride(0));
  return {block_kv, fp8 ? D : D / 2, sf_bytes, cache.stride(0), !fp8, !ascend && fp8};
}

// context_lens [B, next_n] and block_table [B, max_blocks], int32.
inline void check_tables(const char* op, const at::Tensor& context_lens, const at::Tensor& block_table, int64_t B,
                         int64_t next_n) {
  check_rank(op, "context_lens", context_lens, 2, "[B, next_n] (visible KV tokens per query token)");
  AM_CHECK_ARG(context_lens.scalar_type() == at::kInt, op, "context_lens", "dtype", "torch.int32",
               dtype_name(context_lens.scalar_type()));
  AM_CHECK_ARG(context_lens.size(0) == B && context_lens.size(1) == next_n, op, "context_lens", "shape",
               shape_str({B, next_n}) + " (B, next_n of q)", shape_str(context_lens.sizes()));
  check_rank(op, "block_table", block_table, 2, "[B, max_blocks]");
  AM_CHECK_ARG(block_table.scalar_type() == at::kInt, op, "block_table", "dtype", "torch.int32",
               dtype_name(block_table.scalar_type()));
  check_dim_size(op, "block_table", block_table, 0, "B", B, "q.size(0)");
}

// What a paged call (dense or sparse) takes alike: q [B, next_n, H, D], the cache, weights and the tables; returns
// (gq, cache format, logits dtype).
inline std::tuple<int64_t, CacheFormat, at::ScalarType> check_paged_call(
    const char* op, const at::Tensor& q, const std::optional<at::Tensor>& q_sf, const at::Tensor& kv_cache,
    const at::Tensor& weights, const at::Tensor& context_lens, const at::Tensor& block_table, bool ascend,
    std::optional<at::ScalarType> dtype) {
  const int64_t gq = check_operand(op, "q", "q_sf", q, q_sf, 4, "[B, next_n, H, D] (or [B, next_n, H, D/2] packed FP4)",
                                   q);
  const int64_t B = q.size(0), next_n = q.size(1), H = q.size(2), D = logical_k(q);
  AM_CHECK_ARG(next_n > 0 && H > 0 && D > 0, op, "q", "shape", "next_n > 0, H > 0, D > 0", shape_str(q.sizes()));
  const CacheFormat fmt = check_cache(op, kv_cache, D, ascend, q);
  const at::ScalarType out = check_weights(op, weights, q, B * next_n, H, "B * next_n", dtype);
  check_tables(op, context_lens, block_table, B, next_n);
  return {gq, fmt, out};
}

// Checks a paged_mqa_logits call; returns (gq, cache format, logits dtype).
inline std::tuple<int64_t, CacheFormat, at::ScalarType> paged_signature(
    const at::Tensor& q, const std::optional<at::Tensor>& q_sf, const at::Tensor& kv_cache, const at::Tensor& weights,
    const at::Tensor& context_lens, const at::Tensor& block_table, int64_t max_context_len,
    const std::optional<at::Tensor>& indices, bool ascend, std::optional<at::ScalarType> dtype) {
  const char* op = kPaged;
  const auto [gq, fmt, out] = check_paged_call(op, q, q_sf, kv_cache, weights, context_lens, block_table, ascend, dtype);
  const int64_t B = q.size(0), next_n = q.size(1);
  check_int_arg(op, "max_context_len", max_context_len, 0);
  if (indices.has_value()) {
    AM_CHECK_ARG(next_n == 1, op, "indices", "value", "None unless next_n == 1 (varlen: one query per row)",
                 "a tensor with next_n=" + std::to_string(next_n));
    check_rank(op, "indices", *indices, 1, "[B] (request id per query token)");
    AM_CHECK_ARG(indices->scalar_type() == at::kInt, op, "indices", "dtype", "torch.int32",
                 dtype_name(indices->scalar_type()));
    check_dim_size(op, "indices", *indices, 0, "B", B, "q.size(0)");
  }
  return {gq, fmt, out};
}

// Every length >= 0 (lens: context_lens row-major). paged_mqa_logits and its schedule metadata both run this first,
// so one set of lengths gets one verdict from both.
inline void check_context_lens_values(const char* op, const std::vector<int64_t>& lens, int64_t next_n) {
  for (size_t r = 0; r < lens.size(); ++r) {
    AM_CHECK_ARG(lens[r] >= 0, op, "context_lens", "values", "non-negative lengths",
                 "context_lens[" + std::to_string(r / next_n) + ", " + std::to_string(r % next_n) +
                     "]=" + std::to_string(lens[r]));
  }
}

// The paged call's lengths and the block ids they reach, on the data (lens, table: context_lens and block_table
// row-major).
inline void check_paged_values(const std::vector<int64_t>& lens, const std::vector<int64_t>& table, int64_t next_n,
                               int64_t max_blocks, int64_t max_context_len, int64_t block_kv, int64_t num_blocks,
                               const std::optional<at::Tensor>& indices) {
  const char* op = kPaged;
  check_context_lens_values(op, lens, next_n);
  for (int64_t r = 0; r < static_cast<int64_t>(lens.size()); ++r) {
    const int64_t n = lens[r], b = r / next_n;
    AM_CHECK_ARG(n >= 0 && n <= max_context_len && n <= max_blocks * block_kv, op, "context_lens", "values",
                 "0 <= context_lens[b, t] <= min(max_context_len=" + std::to_string(max_context_len) +
                     ", block_table.size(1) * block_kv=" + std::to_string(max_blocks * block_kv) + ")",
                 "context_lens[" + std::to_string(b) + ", " + std::to_string(r % next_n) + "]=" + std::to_string(n));
    for (int64_t p = 0; p < (n + block_kv - 1) / block_kv; ++p) {
      const int64_t id = table[b * max_blocks + p];
      AM_CHECK_ARG(id >= 0 && id < num_blocks, op, "block_table", "values",
                   "physical block ids in [0, num_blocks=" + std::to_string(num_blocks) + ")",
                   "block_table[" + std::to_string(b) + ", " + std::to_string(p) + "]=" + std::to_string(id));
    }
  }
  if (indices.has_value()) {
    // Upstream reads one block-table row per run of equal indices: rows of a run must agree.
    const std::vector<int64_t> ids = to_vector(*indices);
    for (int64_t r = 1; r < static_cast<int64_t>(ids.size()); ++r) {
      const auto row = table.begin() + r * max_blocks;
      AM_CHECK_ARG(ids[r] != ids[r - 1] || std::equal(row, row + max_blocks, row - max_blocks), op, "block_table",
                   "values", "equal rows for query tokens of one request (equal indices)",
                   "rows " + std::to_string(r - 1) + " and " + std::to_string(r) + " differ");
    }
  }
}

// Checks a paged_mqa_logits_metadata call.
inline void metadata_signature(const at::Tensor& context_lens, int64_t block_kv, int64_t num_sms,
                               const std::optional<at::Tensor>& indices) {
  const char* op = kMetadata;
  check_rank(op, "context_lens", context_lens, 2, "[B, next_n] (visible KV tokens per query token)");
  AM_CHECK_ARG(context_lens.scalar_type() == at::kInt, op, "context_lens", "dtype", "torch.int32",
               dtype_name(context_lens.scalar_type()));
  check_int_arg(op, "block_kv", block_kv, 1);
  check_int_arg(op, "num_sms", num_sms, 1);
  if (indices.has_value()) {
    check_rank(op, "indices", *indices, 1, "[B] (request id per query token)");
    AM_CHECK_ARG(indices->scalar_type() == at::kInt, op, "indices", "dtype", "torch.int32",
                 dtype_name(indices->scalar_type()));
    check_dim_size(op, "indices", *indices, 0, "B", context_lens.size(0), "context_lens.size(0)");
  }
}

// ---- top-k selection over the logits ----

// Checks an mqa_topk call.
inline void topk_signature(const at::Tensor& logits, const at::Tensor& ks, const at::Tensor& ke, int64_t topk) {
  const char* op = kTopk;
  check_rank(op, "logits", logits, 2, "[S, columns]");
  AM_CHECK_ARG(is_float_operand(logits.scalar_type()), op, "logits", "dtype",
               "torch.bfloat16, torch.float32 or torch.float64", dtype_name(logits.scalar_type()));
  check_index_vector(op, "ks", ks, logits.size(0), logits, "logits");
  check_index_vector(op, "ke", ke, logits.size(0), logits, "logits");
  check_int_arg(op, "topk", topk, 1);
}

// Every range [ks[i], ke[i]) inside the logits' columns, on the data.
inline void check_topk_values(const std::vector<int64_t>& ks, const std::vector<int64_t>& ke, int64_t columns,
                              bool compressed) {
  for (size_t i = 0; i < ks.size(); ++i) {
    AM_CHECK_ARG(ks[i] >= 0 && ks[i] <= ke[i], kTopk, "ks", "values", "0 <= ks[i] <= ke[i]",
                 "ks[" + std::to_string(i) + "]=" + std::to_string(ks[i]) + ", ke[" + std::to_string(i) +
                     "]=" + std::to_string(ke[i]));
    const int64_t need = compressed ? ke[i] - ks[i] : ke[i];
    AM_CHECK_ARG(need <= columns, kTopk, "ke", "values",
                 (compressed ? "ke[i] - ks[i]" : "ke[i]") + std::string(" <= logits.size(1)=") +
                     std::to_string(columns),
                 "ke[" + std::to_string(i) + "]=" + std::to_string(ke[i]));
  }
}

// mqa_logits_topk's checks: mqa_logits' (full logits) under its own name, then topk.
inline MqaShapes fused_signature(const at::Tensor& q, const std::optional<at::Tensor>& q_sf, const at::Tensor& k,
                                 const std::optional<at::Tensor>& k_sf, const at::Tensor& weights,
                                 const at::Tensor& ks, const at::Tensor& ke, int64_t topk,
                                 std::optional<at::ScalarType> logits_dtype) {
  const MqaShapes sh = mqa_signature(kFused, q, q_sf, k, k_sf, weights, ks, ke, 0, logits_dtype);
  check_int_arg(kFused, "topk", topk, 1);
  return sh;
}

// ---- sparse (DeepSeek V4.1's hierarchical indexer: candidate KV blocks) ----

// block_indices [rows, num_blocks] int32 next to q; returns num_blocks.
inline int64_t check_sparse_indices(const char* op, const at::Tensor& bi, int64_t rows, const char* rows_what,
                                    const char* rows_source, int64_t sbk, const at::Tensor& q) {
  check_rank(op, "block_indices", bi, 2, "[rows, num_blocks] (candidate KV blocks per query row)");
  AM_CHECK_ARG(bi.scalar_type() == at::kInt, op, "block_indices", "dtype", "torch.int32",
               dtype_name(bi.scalar_type()));
  check_same_device_as(op, "block_indices", bi, q);
  check_dim_size(op, "block_indices", bi, 0, rows_what, rows, rows_source);
  check_int_arg(op, "sparse_block_kv", sbk, 1);
  const int64_t nb = bi.size(1);
  AM_CHECK_ARG(nb <= kMaxIntArg / sbk, op, "sparse_block_kv", "value",
               "num_blocks * sparse_block_kv <= 2147483647 (the output's columns)",
               std::to_string(sbk) + " with num_blocks=" + std::to_string(nb));
  return nb;
}

// sparse_mqa_logits' checks; returns (shapes, num_blocks).
inline std::pair<MqaShapes, int64_t> sparse_signature(const at::Tensor& q, const std::optional<at::Tensor>& q_sf,
                                                      const at::Tensor& k, const std::optional<at::Tensor>& k_sf,
                                                      const at::Tensor& weights, const at::Tensor& ks,
                                                      const at::Tensor& ke, const at::Tensor& block_indices,
                                                      int64_t sparse_block_kv,
                                                      std::optional<at::ScalarType> logits_dtype) {
  const MqaShapes sh = mqa_signature(kSparse, q, q_sf, k, k_sf, weights, ks, ke, 0, logits_dtype);
  const int64_t nb = check_sparse_indices(kSparse, block_indices, sh.S, "S", "q.size(0)", sparse_block_kv, q);
  return {sh, nb};
}

// A row's valid slots: min(num_blocks, ceil(length / SBK)).
inline int64_t sparse_slots(int64_t length, int64_t nb, int64_t sbk) { return std::min(nb, (length + sbk - 1) / sbk); }

// Row r's valid slots (idx: block_indices row-major, nb per row): strictly increasing ids, each block
// [id * SBK + shift, + SBK) overlapping [lo, hi); returns their number.
inline int64_t check_sparse_row(const char* op, const std::vector<int64_t>& idx, int64_t nb, int64_t sbk, int64_t r,
                                int64_t lo, int64_t hi, int64_t shift) {
  const int64_t n = sparse_slots(hi - lo, nb, sbk);
  for (int64_t s = 0; s < n; ++s) {
    const int64_t id = idx[r * nb + s], a = id * sbk + shift;
    const std::string at_rs =
        "block_indices[" + std::to_string(r) + ", " + std::to_string(s) + "]=" + std::to_string(id);
    AM_CHECK_ARG(a < hi && a + sbk > lo, op, "block_indices", "values",
                 "blocks overlapping the row's KV range in its valid slots",
                 at_rs + " (tokens [" + std::to_string(a) + ", " + std::to_string(a + sbk) + ")), range [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + ")");
    AM_CHECK_ARG(s == 0 || id > idx[r * nb + s - 1], op, "block_indices", "values",
                 "strictly increasing block ids in the row's valid slots",
                 at_rs + " after " + std::to_string(idx[r * nb + s - 1]));
  }
  return n;
}

// The sparse call's ranges and candidate blocks, on the data (idx: block_indices row-major, nb per row).
inline void check_sparse_values(const std::vector<int64_t>& ks, const std::vector<int64_t>& ke,
                                const std::vector<int64_t>& idx, int64_t nb, int64_t sbk, bool unaligned,
                                int64_t S_kv) {
  check_range_values(kSparse, ks, ke, S_kv, 0);
  for (int64_t i = 0; i < static_cast<int64_t>(ks.size()); ++i) {
    if (!unaligned) {
      AM_CHECK_ARG(ke[i] == ks[i] || ks[i] % sbk == 0, kSparse, "ks", "values",
                   "multiples of sparse_block_kv=" + std::to_string(sbk) +
                       " for non-empty ranges (aligned blocks; unaligned_ks=True otherwise)",
                   "ks[" + std::to_string(i) + "]=" + std::to_string(ks[i]));
    }
    check_sparse_row(kSparse, idx, nb, sbk, i, ks[i], ke[i], unaligned ? ks[i] % sbk : 0);
  }
}

// paged_sparse_mqa_logits' checks; returns (gq, cache format, logits dtype, num_blocks).
inline std::tuple<int64_t, CacheFormat, at::ScalarType, int64_t> paged_sparse_signature(
    const at::Tensor& q, const std::optional<at::Tensor>& q_sf, const at::Tensor& kv_cache, const at::Tensor& weights,
    const at::Tensor& context_lens, const at::Tensor& block_table, const at::Tensor& block_indices,
    int64_t sparse_block_kv, bool ascend, std::optional<at::ScalarType> dtype) {
  const char* op = kPagedSparse;
  const auto [gq, fmt, out] = check_paged_call(op, q, q_sf, kv_cache, weights, context_lens, block_table, ascend, dtype);
  const int64_t B = q.size(0), next_n = q.size(1);
  const int64_t nb = check_sparse_indices(op, block_indices, B * next_n, "B * next_n", "q.size(0) * q.size(1)",
                                          sparse_block_kv, q);
  AM_CHECK_ARG(fmt.block_kv % sparse_block_kv == 0, op, "sparse_block_kv", "value",
               "a divisor of the cache's block_kv=" + std::to_string(fmt.block_kv), sparse_block_kv);
  return {gq, fmt, out, nb};
}

// The paged sparse call's lengths, candidate blocks and the cache blocks they reach, on the data (lens, table, idx:
// context_lens, block_table and block_indices row-major).
inline void check_paged_sparse_values(const std::vector<int64_t>& lens, const std::vector<int64_t>& table,
                                      const std::vector<int64_t>& idx, int64_t next_n, int64_t max_blocks, int64_t nb,
                                      int64_t sbk, int64_t block_kv, int64_t num_blocks) {
  const char* op = kPagedSparse;
  check_context_lens_values(op, lens, next_n);
  for (int64_t r = 0; r < static_cast<int64_t>(lens.size()); ++r) {
    const int64_t n = lens[r], b = r / next_n;
    AM_CHECK_ARG(n <= max_blocks * block_kv, op, "context_lens", "values",
                 "context_lens[b, t] <= block_table.size(1) * block_kv=" + std::to_string(max_blocks * block_kv),
                 "context_lens[" + std::to_string(b) + ", " + std::to_string(r % next_n) + "]=" + std::to_string(n));
    const int64_t slots = check_sparse_row(op, idx, nb, sbk, r, 0, n, 0);
    for (int64_t s = 0; s < slots; ++s) {
      const int64_t p = idx[r * nb + s] * sbk / block_kv, id = table[b * max_blocks + p];
      AM_CHECK_ARG(id >= 0 && id < num_blocks, op, "block_table", "values",
                   "physical block ids in [0, num_blocks=" + std::to_string(num_blocks) + ")",
                   "block_table[" + std::to_string(b) + ", " + std::to_string(p) + "]=" + std::to_string(id));
    }
  }
}

}  // namespace ascend_moe::mqa_logits
