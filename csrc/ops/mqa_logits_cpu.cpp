// CPU kernels of the mqa_logits family: DeepSeek's sparse-attention "lightning indexer" scores
// (specs/deepgemm_api.md §8, §16.2).
//
//   logits[i, j] = sum_h weights[i, h] * relu(deq(q)[i, h, :] . deq(k)[j, :])   for ks[i] <= j < ke[i]
//
// and exactly -inf elsewhere. The [S, H, S_kv] scores are never materialized: queries go in tiles of
// about 256 (query, head) rows, KV in chunks of kChunk tokens; one SGEMM per (tile, chunk) gives a
// [rows, chunk] score block that is reduced over heads at once. The tiling depends only on the shapes,
// never on the thread count, so repeated calls are bitwise equal. The backward recomputes the scores the
// same way (dq and dweights in a pass over query tiles, dk in a pass over KV chunks) and stores nothing
// of size S x H x S_kv either.
//
// Operands: q [S, H, D], k [S_kv, D] in BF16/FP32/FP64 (no scales), or FP8 E4M3 / packed FP4 (uint8,
// [.., D/2]) with FP32 or E8M0 scales [.., D / g] (one per 1 x g block; FP8 q may omit them = 1). FP8 and
// FP4 accumulate in FP32; FP64 operands in FP64 (gradcheck).
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/max.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "checks.h"
#include "vector_clones.h"
#include "fp8_gemm.h"

namespace ascend_moe {
namespace {

constexpr const char* kOp = "ascend_moe::mqa_logits";
constexpr const char* kBackward = "ascend_moe::mqa_logits_backward";
constexpr const char* kPaged = "ascend_moe::paged_mqa_logits";
constexpr const char* kMetadata = "ascend_moe::paged_mqa_logits_metadata";
constexpr const char* kTopk = "ascend_moe::mqa_topk";
constexpr const char* kFused = "ascend_moe::mqa_logits_topk";
constexpr const char* kSparse = "ascend_moe::sparse_mqa_logits";
constexpr const char* kPagedSparse = "ascend_moe::paged_sparse_mqa_logits";
constexpr int64_t kTileRows = 256;  // (query, head) rows per score block
constexpr int64_t kChunk = 512;     // KV tokens per score block
constexpr int64_t kScheduleSplit = 256;  // KV tokens per unit of the paged schedule (upstream's split)


bool is_quantized(const at::Tensor& t) {
  return t.scalar_type() == at::kFloat8_e4m3fn || t.scalar_type() == at::kByte;
}

bool is_float_operand(at::ScalarType t) { return t == at::kBFloat16 || t == at::kFloat || t == at::kDouble; }

// Validates one operand (`lead` leading dims before D) and its optional scales; returns the block size g.
int64_t check_operand(const char* op, const char* name, const char* sf_name, const at::Tensor& x,
                      const std::optional<at::Tensor>& sf, int64_t rank, const char* layout, const at::Tensor& ref) {
  check_rank(op, name, x, rank, layout);
  const at::ScalarType t = x.scalar_type();
  AM_CHECK_ARG(is_float_operand(t) || is_quantized(x), op, name, "dtype",
               "torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn or torch.uint8 (packed FP4)",
               dtype_name(t));
  AM_CHECK_ARG(x.device() == ref.device(), op, name, "device", ref.device().str() + " (same as 'q')",
               x.device().str());
  const int64_t D = logical_k(x);
  if (!is_quantized(x)) {
    AM_CHECK_ARG(!sf.has_value(), op, sf_name, "value", "None for a " + dtype_name(t) + " operand",
                 "a tensor");
    return D;
  }
  if (!sf.has_value()) {
    AM_CHECK_ARG(!is_fp4(x), op, sf_name, "value", "scales for a packed FP4 operand", "None");
    return D;
  }
  AM_CHECK_ARG(sf->scalar_type() == at::kFloat || sf->scalar_type() == at::kFloat8_e8m0fnu, op, sf_name, "dtype",
               "torch.float32 or torch.float8_e8m0fnu (unpack int32/int16 UE8M0 first)",
               dtype_name(sf->scalar_type()));
  AM_CHECK_ARG(sf->device() == ref.device(), op, sf_name, "device", ref.device().str() + " (same as 'q')",
               sf->device().str());
  std::vector<int64_t> lead(x.sizes().begin(), x.sizes().end() - 1);
  const bool lead_ok = sf->dim() == rank && std::equal(lead.begin(), lead.end(), sf->sizes().begin());
  const int64_t nb = sf->dim() == rank ? sf->size(-1) : 0;
  std::string expected = shape_str(lead);
  expected = expected.substr(0, expected.size() - 1) + ", D / g] with g dividing D=" + std::to_string(D);
  AM_CHECK_ARG(lead_ok && nb > 0 && D % nb == 0, op, sf_name, "shape", expected, shape_str(sf->sizes()));
  return D / nb;
}

// The computation dtype of an (q, k) pair: FP64 for FP64 operands, else FP32.
at::ScalarType acc_dtype(const at::Tensor& q) { return q.scalar_type() == at::kDouble ? at::kDouble : at::kFloat; }

// q and k are both high precision (one dtype) or both quantized (FP8 and FP4 may mix).
void check_pairing(const char* op, const at::Tensor& q, const at::Tensor& k, int64_t D, int64_t Dk) {
  if (is_quantized(q)) {
    AM_CHECK_ARG(is_quantized(k), op, "k", "dtype", "torch.float8_e4m3fn or torch.uint8 (packed FP4), as 'q' is",
                 dtype_name(k.scalar_type()));
  } else {
    AM_CHECK_ARG(k.scalar_type() == q.scalar_type(), op, "k", "dtype",
                 dtype_name(q.scalar_type()) + " (same as 'q')", dtype_name(k.scalar_type()));
  }
  AM_CHECK_ARG(Dk == D, op, "k", "head dim (D)", std::to_string(D) + " (q's D)", Dk);
}

// weights [rows, H]; returns the logits dtype (default: the weights' dtype).
at::ScalarType check_weights(const char* op, const at::Tensor& w, const at::Tensor& q, int64_t rows, int64_t H,
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
  AM_CHECK_ARG(w.device() == q.device(), op, "weights", "device", q.device().str() + " (same as 'q')",
               w.device().str());
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

void check_index_vector(const char* op, const char* name, const at::Tensor& t, int64_t length, const char* what,
                        const at::Tensor& ref) {
  check_rank(op, name, t, 1, "[S] (one per query)");
  AM_CHECK_ARG(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, op, name, "dtype",
               "torch.int32 or torch.int64", dtype_name(t.scalar_type()));
  AM_CHECK_ARG(t.device() == ref.device(), op, name, "device", ref.device().str() + " (same as 'q')",
               t.device().str());
  check_dim_size(op, name, t, 0, what, length, "q.size(0)");
}

std::vector<int64_t> to_vector(const at::Tensor& t) {
  const at::Tensor c = t.to(at::kCPU, at::kLong).contiguous();
  return std::vector<int64_t>(c.const_data_ptr<int64_t>(), c.const_data_ptr<int64_t>() + c.numel());
}

// The ranges [ks[i], ke[i]) checked against the data (a fake cannot see values).
void check_ranges(const char* op, const std::vector<int64_t>& ks, const std::vector<int64_t>& ke, int64_t S_kv,
                  int64_t max_seqlen_k) {
  for (size_t i = 0; i < ks.size(); ++i) {
    const std::string at_i = "[" + std::to_string(i) + "]";
    AM_CHECK_ARG(ks[i] >= 0 && ks[i] <= ke[i], op, "ks", "values", "0 <= ks[i] <= ke[i]",
                 "ks" + at_i + "=" + std::to_string(ks[i]) + ", ke" + at_i + "=" + std::to_string(ke[i]));
    AM_CHECK_ARG(ke[i] <= S_kv, op, "ke", "values", "ke[i] <= S_kv=" + std::to_string(S_kv) + " (k.size(0))",
                 "ke" + at_i + "=" + std::to_string(ke[i]));
    if (max_seqlen_k > 0) {
      AM_CHECK_ARG(ke[i] - ks[i] <= max_seqlen_k, op, "max_seqlen_k", "value",
                   "at least ke[i] - ks[i] for every query (compressed logits)",
                   std::to_string(max_seqlen_k) + " < ke" + at_i + " - ks" + at_i + "=" +
                       std::to_string(ke[i] - ks[i]));
    }
  }
}

struct Shapes {
  int64_t S, H, D, S_kv, gq, gk;
  at::ScalarType out_t;
};

Shapes check_mqa(const char* op, const at::Tensor& q, const std::optional<at::Tensor>& q_sf, const at::Tensor& k,
                 const std::optional<at::Tensor>& k_sf, const at::Tensor& weights, const at::Tensor& ks,
                 const at::Tensor& ke, int64_t max_seqlen_k, std::optional<at::ScalarType> logits_dtype) {
  const int64_t gq = check_operand(op, "q", "q_sf", q, q_sf, 3, "[S, H, D] (or [S, H, D/2] packed FP4)", q);
  const int64_t gk = check_operand(op, "k", "k_sf", k, k_sf, 2, "[S_kv, D] (or [S_kv, D/2] packed FP4)", q);
  const int64_t D = logical_k(q);
  check_pairing(op, q, k, D, logical_k(k));
  const int64_t S = q.size(0), H = q.size(1);
  AM_CHECK_ARG(H > 0 && D > 0, op, "q", "shape", "H > 0 heads of D > 0", shape_str(q.sizes()));
  const at::ScalarType out_t = check_weights(op, weights, q, S, H, "S", logits_dtype);
  check_index_vector(op, "ks", ks, S, "S", q);
  check_index_vector(op, "ke", ke, S, "S", q);
  AM_CHECK_ARG(max_seqlen_k >= 0, op, "max_seqlen_k", "value", "0 (full [S, S_kv] logits) or positive (compressed)",
               max_seqlen_k);
  AM_CHECK_ARG(max_seqlen_k <= kMaxIntArg, op, "max_seqlen_k", "value",
               "at most 2147483647 (integer arguments are int32-sized)", max_seqlen_k);
  return {S, H, D, k.size(0), gq, gk, out_t};
}

// deq(x) for rows [r0, r0 + rows) of a [R, D(/2)] operand, in `acc` (FP32, or FP64 for FP64 data).
at::Tensor dequantize(const at::Tensor& x2, const std::optional<at::Tensor>& sf2, int64_t g, int64_t r0, int64_t rows,
                      at::ScalarType acc) {
  if (!is_quantized(x2)) return x2.narrow(0, r0, rows).to(acc).contiguous();
  const at::Tensor sf = sf2.has_value() ? *sf2 : at::ones({x2.size(0), 1}, x2.options().dtype(at::kFloat));
  return dequantize_rows(x2, sf, 1, g, r0, rows);
}

// Rows of an operand flattened to [R, D(/2)], and its scales to [R, D / g].
at::Tensor rows_of(const at::Tensor& x) { return x.reshape({-1, x.size(-1)}); }
std::optional<at::Tensor> rows_of(const std::optional<at::Tensor>& sf) {
  if (!sf.has_value()) return std::nullopt;
  return sf->reshape({-1, sf->size(-1)});
}

// out[c] = sum_h w[h] * max(s[h, c], 0) over `n` columns of `H` score rows (row stride ld).
template <typename T>
AM_VECTOR_CLONES void reduce_heads(const T* s, int64_t ld, const T* w, int64_t H, int64_t n, T* out) {
  for (int64_t c = 0; c < n; ++c) out[c] = T(0);
  for (int64_t h = 0; h < H; ++h) {
    const T wh = w[h];
    const T* row = s + h * ld;
#pragma omp simd
    for (int64_t c = 0; c < n; ++c) out[c] += wh * std::max(row[c], T(0));
  }
}

// BF16 logits are scored shape-independently ("exact" scoring): q . k in FP64 (exact for FP8/FP4 values with
// power-of-two scales and for BF16 values, so no summation order changes it), rounded once to FP32, then the head
// sum in a fixed order. An SGEMM's sum order follows the matrix shapes (MKL's small-N kernels differ in the last bit), so
// without this a logit's bits would depend on the tile, the chunk and the op that computed it: with it the dense,
// paged and sparse ops give the same bits at the same position, as DeepGEMM's sparse indexer does against its
// dense one (its test compares them bitwise). FP32 logits keep the SGEMM path.
// Scores near FP32's limit (|q| * |k| * D reaching it: hostile data) keep the SGEMM, whose overflows to inf and NaN
// are every other kernel's (an FP64 sum would stay finite where FP32's is inf); NaN operands take it too.
at::Tensor score_block(const at::Tensor& qd, const at::Tensor& keys, bool exact) {
  if (!exact || qd.scalar_type() == at::kDouble || keys.size(0) == 0 || qd.size(0) == 0) return at::mm(qd, keys.t());
  const double bound = qd.abs().max().item<double>() * keys.abs().max().item<double>() * static_cast<double>(qd.size(1));
  if (!(bound < static_cast<double>(std::numeric_limits<float>::max()))) return at::mm(qd, keys.t());
  return at::mm(qd.to(at::kDouble), keys.to(at::kDouble).t());
}

// The head sum stays in T (FP32), one fused multiply-add per head in head order: a fixed order whatever the shapes.
template <typename T>
void reduce_heads_exact(const double* s, int64_t ld, const T* w, int64_t H, int64_t n, T* out) {
  for (int64_t c = 0; c < n; ++c) {
    T acc = T(0);
    for (int64_t h = 0; h < H; ++h) acc = std::fma(w[h], std::max(static_cast<T>(s[h * ld + c]), T(0)), acc);
    out[c] = acc;
  }
}

// reduce_heads over columns [c0, c0 + n) of rows [r0, r0 + H) of a score block from score_block.
template <typename T>
void reduce_scores(const at::Tensor& s, int64_t r0, int64_t c0, const T* w, int64_t H, int64_t n, T* out) {
  const int64_t ld = s.size(1);
  if (s.scalar_type() == c10::CppTypeToScalarType<T>::value) {
    reduce_heads<T>(s.const_data_ptr<T>() + r0 * ld + c0, ld, w, H, n, out);
  } else {
    reduce_heads_exact<T>(s.const_data_ptr<double>() + r0 * ld + c0, ld, w, H, n, out);
  }
}

// Backward of reduce_heads in place: dw[h] += sum_c g[c] * relu(s[h, c]); s[h, c] becomes g[c] * w[h] * [s > 0].
template <typename T>
// Only columns [lo, hi) are the query's logits: the others of the block contribute nothing, not even a NaN score
// or weight times a zero gradient.
AM_VECTOR_CLONES void backprop_heads(T* s, int64_t ld, const T* w, int64_t H, int64_t lo, int64_t hi, int64_t n,
                                     const T* g, T* dw) {
  for (int64_t h = 0; h < H; ++h) {
    const T wh = w[h];
    T* row = s + h * ld;
    T acc = T(0);
    std::fill(row, row + lo, T(0));
#pragma omp simd reduction(+ : acc)
    for (int64_t c = lo; c < hi; ++c) {
      const T x = row[c];
      acc += g[c] * std::max(x, T(0));
      row[c] = x > T(0) ? g[c] * wh : T(0);
    }
    std::fill(row + hi, row + n, T(0));
    if (dw != nullptr) dw[h] += acc;
  }
}

// The tiling shared by forward and backward: query tiles of ~kTileRows (query, head) rows.
int64_t queries_per_tile(int64_t H) { return std::max<int64_t>(1, kTileRows / H); }

// The KV span [lo, hi) that queries [i0, i1) need (lo >= hi when none).
std::pair<int64_t, int64_t> tile_span(const std::vector<int64_t>& ks, const std::vector<int64_t>& ke, int64_t i0,
                                      int64_t i1) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = 0;
  for (int64_t i = i0; i < i1; ++i) {
    if (ke[i] > ks[i]) {
      lo = std::min(lo, ks[i]);
      hi = std::max(hi, ke[i]);
    }
  }
  return {lo, hi};
}

// Query tile t's logits (queries [t * qt, ...) and the KV span they need): store(i, a, row, n) receives query i's
// logits at KV positions [a, a + n), one score block (kChunk keys) at a time. The tiling depends only on the shapes
// and the range values, so every consumer (the full logits, the fused top-k) sees the same values.
template <typename T, typename Store>
void tile_logits(const at::Tensor& q2, const std::optional<at::Tensor>& qsf2, int64_t gq, const at::Tensor& kd,
                 const T* wp, const std::vector<int64_t>& ks, const std::vector<int64_t>& ke, int64_t H, int64_t t,
                 bool exact, std::vector<T>& row, Store&& store) {
  const at::ScalarType acc = c10::CppTypeToScalarType<T>::value;
  const int64_t S = static_cast<int64_t>(ks.size()), qt = queries_per_tile(H);
  const int64_t i0 = t * qt, i1 = std::min(S, i0 + qt);
  const auto [lo, hi] = tile_span(ks, ke, i0, i1);
  if (lo >= hi) return;
  const at::Tensor qd = dequantize(q2, qsf2, gq, i0 * H, (i1 - i0) * H, acc);
  for (int64_t j0 = lo; j0 < hi; j0 += kChunk) {
    const int64_t jc = std::min(kChunk, hi - j0);
    const at::Tensor s = score_block(qd, kd.narrow(0, j0, jc), exact);  // [(i1 - i0) * H, jc]
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t a = std::max(ks[i], j0), b = std::min(ke[i], j0 + jc);
      if (a >= b) continue;
      reduce_scores<T>(s, (i - i0) * H, a - j0, wp + i * H, H, b - a, row.data());
      store(i, a, row.data(), b - a);
    }
  }
}

template <typename T>
void mqa_forward(const at::Tensor& q2, const std::optional<at::Tensor>& qsf2, int64_t gq, const at::Tensor& kd,
                 const at::Tensor& w, const std::vector<int64_t>& ks, const std::vector<int64_t>& ke, int64_t H,
                 bool compressed, bool exact, at::Tensor& out) {
  const int64_t S = static_cast<int64_t>(ks.size()), ncols = out.size(1), qt = queries_per_tile(H);
  const at::Tensor wf = w.to(c10::CppTypeToScalarType<T>::value).contiguous();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, (S + qt - 1) / qt, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> row(kChunk);
    for (int64_t t = t0; t < t1; ++t) {
      tile_logits<T>(q2, qsf2, gq, kd, wf.const_data_ptr<T>(), ks, ke, H, t, exact, row,
                     [&](int64_t i, int64_t a, const T* values, int64_t n) {
                       std::memcpy(op + i * ncols + (compressed ? a - ks[i] : a), values, sizeof(T) * n);
                     });
    }
  });
}

at::Tensor mqa_logits_cpu(const at::Tensor& q, const std::optional<at::Tensor>& q_sf, const at::Tensor& k,
                          const std::optional<at::Tensor>& k_sf, const at::Tensor& weights, const at::Tensor& ks,
                          const at::Tensor& ke, int64_t max_seqlen_k, std::optional<at::ScalarType> logits_dtype) {
  const Shapes sh = check_mqa(kOp, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype);
  const std::vector<int64_t> ksv = to_vector(ks), kev = to_vector(ke);
  check_ranges(kOp, ksv, kev, sh.S_kv, max_seqlen_k);
  const at::ScalarType acc = acc_dtype(q);
  const int64_t ncols = max_seqlen_k > 0 ? max_seqlen_k : sh.S_kv;
  at::Tensor out = at::full({sh.S, ncols}, -std::numeric_limits<double>::infinity(), q.options().dtype(acc));
  const at::Tensor kd = dequantize(rows_of(k), rows_of(k_sf), sh.gk, 0, sh.S_kv, acc);
  if (acc == at::kDouble) {
    mqa_forward<double>(rows_of(q), rows_of(q_sf), sh.gq, kd, weights, ksv, kev, sh.H, max_seqlen_k > 0, false, out);
  } else {
    const bool exact = sh.out_t == at::kBFloat16;
    mqa_forward<float>(rows_of(q), rows_of(q_sf), sh.gq, kd, weights, ksv, kev, sh.H, max_seqlen_k > 0, exact, out);
  }
  return out.scalar_type() == sh.out_t ? out : out.to(sh.out_t);
}

template <typename T>
void mqa_backward(const at::Tensor& gd, const at::Tensor& qd, const at::Tensor& kd, const at::Tensor& w,
                  const std::vector<int64_t>& ks, const std::vector<int64_t>& ke, int64_t H, bool compressed,
                  at::Tensor& dq, at::Tensor& dk, at::Tensor& dw) {
  const at::ScalarType acc = c10::CppTypeToScalarType<T>::value;
  const int64_t S = static_cast<int64_t>(ks.size()), S_kv = kd.size(0), ncols = gd.size(1);
  const int64_t qt = queries_per_tile(H), tiles = (S + qt - 1) / qt;
  const at::Tensor wf = w.to(acc).contiguous();
  const T* wp = wf.const_data_ptr<T>();
  const T* gp = gd.const_data_ptr<T>();
  // P[(i, h), j] = g[i, j] * w[i, h] * [s > 0] for one (tile, chunk) block, in place of the scores.
  auto block = [&](int64_t i0, int64_t i1, int64_t j0, int64_t jc, T* dwp) {
    at::Tensor s = at::mm(qd.narrow(0, i0 * H, (i1 - i0) * H), kd.narrow(0, j0, jc).t());
    T* sp = s.data_ptr<T>();
    std::vector<T> g(jc);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t a = std::max(ks[i], j0), b = std::min(ke[i], j0 + jc);
      std::fill(g.begin(), g.end(), T(0));
      if (a < b) std::memcpy(g.data() + (a - j0), gp + i * ncols + (compressed ? a - ks[i] : a), sizeof(T) * (b - a));
      const int64_t lo = std::clamp<int64_t>(a - j0, 0, jc), hi = std::clamp<int64_t>(b - j0, lo, jc);
      backprop_heads<T>(sp + (i - i0) * H * jc, jc, wp + i * H, H, lo, hi, jc, g.data(), dwp ? dwp + i * H : nullptr);
    }
    return s;
  };
  const bool need_q = dq.numel() > 0, need_w = dw.numel() > 0, need_k = dk.numel() > 0;
  if (need_q || need_w) {
    at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t i0 = t * qt, i1 = std::min(S, i0 + qt);
        const auto [lo, hi] = tile_span(ks, ke, i0, i1);
        for (int64_t j0 = lo; j0 < hi; j0 += kChunk) {
          const int64_t jc = std::min(kChunk, hi - j0);
          const at::Tensor p = block(i0, i1, j0, jc, need_w ? dw.data_ptr<T>() : nullptr);
          if (need_q) dq.narrow(0, i0 * H, (i1 - i0) * H).addmm_(p, kd.narrow(0, j0, jc));
        }
      }
    });
  }
  if (need_k) {
    std::vector<std::pair<int64_t, int64_t>> spans(tiles);
    for (int64_t t = 0; t < tiles; ++t) spans[t] = tile_span(ks, ke, t * qt, std::min(S, (t + 1) * qt));
    at::parallel_for(0, (S_kv + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t j0 = c * kChunk, jc = std::min(kChunk, S_kv - j0);
        at::Tensor dk_c = dk.narrow(0, j0, jc);
        for (int64_t t = 0; t < tiles; ++t) {
          if (spans[t].first >= std::min(spans[t].second, j0 + jc) || spans[t].second <= j0) continue;
          const int64_t i0 = t * qt, i1 = std::min(S, i0 + qt);
          const at::Tensor p = block(i0, i1, j0, jc, nullptr);
          dk_c.addmm_(p.t(), qd.narrow(0, i0 * H, (i1 - i0) * H));
        }
      }
    });
  }
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> mqa_logits_backward_cpu(
    const at::Tensor& grad, const at::Tensor& q, const std::optional<at::Tensor>& q_sf, const at::Tensor& k,
    const std::optional<at::Tensor>& k_sf, const at::Tensor& weights, const at::Tensor& ks, const at::Tensor& ke,
    int64_t max_seqlen_k, std::array<bool, 3> output_mask) {
  const Shapes sh = check_mqa(kBackward, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, std::nullopt);
  const int64_t ncols = max_seqlen_k > 0 ? max_seqlen_k : sh.S_kv;
  check_rank(kBackward, "grad", grad, 2, "[S, columns] (the logits' gradient)");
  AM_CHECK_ARG(grad.size(0) == sh.S && grad.size(1) == ncols, kBackward, "grad", "shape",
               shape_str({sh.S, ncols}) + " (the logits' shape)", shape_str(grad.sizes()));
  AM_CHECK_ARG(is_float_operand(grad.scalar_type()), kBackward, "grad", "dtype",
               "torch.bfloat16, torch.float32 or torch.float64", dtype_name(grad.scalar_type()));
  const std::vector<int64_t> ksv = to_vector(ks), kev = to_vector(ke);
  check_ranges(kBackward, ksv, kev, sh.S_kv, max_seqlen_k);
  const at::ScalarType acc = acc_dtype(q);
  const auto opts = q.options().dtype(acc);
  at::Tensor dq = output_mask[0] ? at::zeros({sh.S * sh.H, sh.D}, opts) : at::empty({0}, opts);
  at::Tensor dk = output_mask[1] ? at::zeros({sh.S_kv, sh.D}, opts) : at::empty({0}, opts);
  at::Tensor dw = output_mask[2] ? at::zeros({sh.S, sh.H}, opts) : at::empty({0}, opts);
  // The backward passes revisit every query tile per KV chunk: dequantize q once (S x H x D, not x S_kv).
  const at::Tensor qd = dequantize(rows_of(q), rows_of(q_sf), sh.gq, 0, sh.S * sh.H, acc);
  const at::Tensor kd = dequantize(rows_of(k), rows_of(k_sf), sh.gk, 0, sh.S_kv, acc);
  const at::Tensor gd = grad.to(acc).contiguous();
  if (acc == at::kDouble) {
    mqa_backward<double>(gd, qd, kd, weights, ksv, kev, sh.H, max_seqlen_k > 0, dq, dk, dw);
  } else {
    mqa_backward<float>(gd, qd, kd, weights, ksv, kev, sh.H, max_seqlen_k > 0, dq, dk, dw);
  }
  if (output_mask[0]) dq = dq.view({sh.S, sh.H, sh.D});
  return {dq, dk, dw};
}

// ---- paged decode ----

// Per-token scale bytes of a cache block: DeepGEMM stores 4 (FP8: one FP32; FP4: four UE8M0 codes, one per
// 32 values), the Ascend fused page layout D / 32 (one UE8M0 code per 32 values, int16-packed in pairs).
struct CacheFormat {
  int64_t block_kv, data_bytes, sf_bytes, block_stride;
  bool fp4, fp32_scale;
};

CacheFormat check_cache(const char* op, const at::Tensor& cache, int64_t D, bool ascend, const at::Tensor& q) {
  check_rank(op, "kv_cache", cache, 4, "[num_blocks, block_kv, 1, bytes per token] (uint8)");
  AM_CHECK_ARG(cache.scalar_type() == at::kByte, op, "kv_cache", "dtype", "torch.uint8",
               dtype_name(cache.scalar_type()));
  AM_CHECK_ARG(cache.device() == q.device(), op, "kv_cache", "device", q.device().str() + " (same as 'q')",
               cache.device().str());
  const int64_t row = cache.size(3);
  const int64_t sf_bytes = ascend ? D / 32 : 4;
  const bool fp8 = row == D + sf_bytes, fp4 = row == D / 2 + sf_bytes;
  const bool d_ok = ascend ? D % 64 == 0 : (D % 2 == 0 && (fp8 || D % 32 == 0) && (fp8 || D <= 128));
  AM_CHECK_ARG(d_ok && (fp8 || fp4), op, "kv_cache", "size(3) (bytes per token)",
               std::string(ascend ? "D + D/32 (FP8) or D/2 + D/32 (FP4) with D % 64 == 0"
                                  : "D + 4 (FP8) or D/2 + 4 (FP4, D % 32 == 0 and D <= 128)") +
                   " for D=" + std::to_string(D),
               row);
  AM_CHECK_ARG(cache.size(2) == 1, op, "kv_cache", "size(2) (KV heads)", 1, cache.size(2));
  AM_CHECK_ARG(cache.stride(3) == 1 && cache.stride(1) == row, op, "kv_cache", "strides (1, 3)",
               "(" + std::to_string(row) + ", 1): token rows packed in each block",
               "(" + std::to_string(cache.stride(1)) + ", " + std::to_string(cache.stride(3)) + ")");
  const int64_t block_kv = cache.size(1);
  AM_CHECK_ARG(cache.size(0) <= 1 || cache.stride(0) >= block_kv * row, op, "kv_cache", "stride(0)",
               "at least block_kv * bytes per token = " + std::to_string(block_kv * row), cache.stride(0));
  return {block_kv, fp8 ? D : D / 2, sf_bytes, cache.stride(0), !fp8, !ascend && fp8};
}

// deq of tokens [first, first + n) of one physical block into dst [n, D] (FP32).
void dequantize_block(const uint8_t* block, const CacheFormat& f, int64_t D, int64_t n, float* dst, int64_t first = 0) {
  decode_quantized_rows(block + first * f.data_bytes, n, f.data_bytes, D, f.fp4, dst);
  const uint8_t* sf = block + f.block_kv * f.data_bytes + first * f.sf_bytes;
  for (int64_t t = 0; t < n; ++t) {
    float* r = dst + t * D;
    if (f.fp32_scale) {
      float s;
      std::memcpy(&s, sf + t * f.sf_bytes, sizeof(float));
      for (int64_t d = 0; d < D; ++d) r[d] *= s;
    } else {
      for (int64_t d = 0; d < D; ++d) {
        const uint8_t code = sf[t * f.sf_bytes + d / 32];
        // UE8M0 0xFF is NaN (float8_e8m0fnu), not 2^128.
        r[d] *= code == 0xFF ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.f, static_cast<int>(code) - 127);
      }
    }
  }
}

template <typename T>
void paged_forward(const at::Tensor& q2, const std::optional<at::Tensor>& qsf2, int64_t gq, const at::Tensor& cache,
                   const CacheFormat& f, const at::Tensor& w, const std::vector<int64_t>& lens,
                   const std::vector<int64_t>& table, int64_t max_blocks, int64_t B, int64_t next_n, int64_t H,
                   int64_t D, bool exact, at::Tensor& out) {
  const at::ScalarType acc = c10::CppTypeToScalarType<T>::value;
  const int64_t ncols = out.size(1), chunk_blocks = std::max<int64_t>(1, kChunk / f.block_kv);
  const at::Tensor wf = w.to(acc).contiguous();
  const T* wp = wf.const_data_ptr<T>();
  T* op = out.data_ptr<T>();
  const uint8_t* base = cache.const_data_ptr<uint8_t>();
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<T> row(chunk_blocks * f.block_kv);
    for (int64_t b = b0; b < b1; ++b) {
      int64_t L = 0;
      for (int64_t t = 0; t < next_n; ++t) L = std::max(L, std::min(lens[b * next_n + t], ncols));
      if (L == 0) continue;
      const at::Tensor qd = dequantize(q2, qsf2, gq, b * next_n * H, next_n * H, acc);
      const int64_t nblocks = (L + f.block_kv - 1) / f.block_kv;
      for (int64_t p0 = 0; p0 < nblocks; p0 += chunk_blocks) {
        const int64_t pc = std::min(chunk_blocks, nblocks - p0), j0 = p0 * f.block_kv;
        const int64_t jc = std::min(pc * f.block_kv, L - j0);
        at::Tensor kf = at::empty({jc, D}, at::kFloat);
        for (int64_t p = 0; p < pc; ++p) {
          const int64_t phys = table[b * max_blocks + p0 + p];
          dequantize_block(base + phys * f.block_stride, f, D, std::min(f.block_kv, jc - p * f.block_kv),
                           kf.data_ptr<float>() + p * f.block_kv * D);
        }
        const at::Tensor s = score_block(qd, kf.to(acc), exact);  // [next_n * H, jc]
        for (int64_t t = 0; t < next_n; ++t) {
          const int64_t r = b * next_n + t, n = std::min(std::min(lens[r], ncols) - j0, jc);
          if (n <= 0) continue;
          reduce_scores<T>(s, t * H, 0, wp + r * H, H, n, row.data());
          std::memcpy(op + r * ncols + j0, row.data(), sizeof(T) * n);
        }
      }
    }
  });
}

// context_lens [B, next_n] and block_table [B, max_blocks], int32.
void check_tables(const char* op, const at::Tensor& context_lens, const at::Tensor& block_table, int64_t B,
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

// Every length >= 0. Both paged_mqa_logits and its schedule metadata run this first, so one set of lengths
// gets one verdict from both.
void check_context_lens_values(const char* op, const std::vector<int64_t>& lens, int64_t next_n) {
  for (size_t r = 0; r < lens.size(); ++r) {
    AM_CHECK_ARG(lens[r] >= 0, op, "context_lens", "values", "non-negative lengths",
                 "context_lens[" + std::to_string(r / next_n) + ", " + std::to_string(r % next_n) +
                     "]=" + std::to_string(lens[r]));
  }
}

at::Tensor paged_mqa_logits_cpu(const at::Tensor& q, const std::optional<at::Tensor>& q_sf, const at::Tensor& kv_cache,
                                const at::Tensor& weights, const at::Tensor& context_lens,
                                const at::Tensor& block_table, int64_t max_context_len,
                                const std::optional<at::Tensor>& indices, bool ascend_kv_layout,
                                std::optional<at::ScalarType> logits_dtype) {
  const int64_t gq = check_operand(kPaged, "q", "q_sf", q, q_sf, 4,
                                   "[B, next_n, H, D] (or [B, next_n, H, D/2] packed FP4)", q);
  const int64_t B = q.size(0), next_n = q.size(1), H = q.size(2), D = logical_k(q);
  AM_CHECK_ARG(next_n > 0 && H > 0 && D > 0, kPaged, "q", "shape", "next_n > 0, H > 0, D > 0",
               shape_str(q.sizes()));
  const CacheFormat f = check_cache(kPaged, kv_cache, D, ascend_kv_layout, q);
  const at::ScalarType out_t = check_weights(kPaged, weights, q, B * next_n, H, "B * next_n", logits_dtype);
  check_tables(kPaged, context_lens, block_table, B, next_n);
  check_int_arg(kPaged, "max_context_len", max_context_len, 0);
  if (indices.has_value()) {
    AM_CHECK_ARG(next_n == 1, kPaged, "indices", "value", "None unless next_n == 1 (varlen: one query per row)",
                 "a tensor with next_n=" + std::to_string(next_n));
    check_rank(kPaged, "indices", *indices, 1, "[B] (request id per query token)");
    AM_CHECK_ARG(indices->scalar_type() == at::kInt, kPaged, "indices", "dtype", "torch.int32",
                 dtype_name(indices->scalar_type()));
    check_dim_size(kPaged, "indices", *indices, 0, "B", B, "q.size(0)");
  }
  const std::vector<int64_t> lens = to_vector(context_lens), table = to_vector(block_table);
  const int64_t max_blocks = block_table.size(1), num_blocks = kv_cache.size(0);
  check_context_lens_values(kPaged, lens, next_n);
  for (int64_t r = 0; r < B * next_n; ++r) {
    const int64_t L = lens[r], b = r / next_n;
    AM_CHECK_ARG(L >= 0 && L <= max_context_len && L <= max_blocks * f.block_kv, kPaged, "context_lens", "values",
                 "0 <= context_lens[b, t] <= min(max_context_len=" + std::to_string(max_context_len) +
                     ", block_table.size(1) * block_kv=" + std::to_string(max_blocks * f.block_kv) + ")",
                 "context_lens[" + std::to_string(b) + ", " + std::to_string(r % next_n) + "]=" + std::to_string(L));
    for (int64_t p = 0; p < (L + f.block_kv - 1) / f.block_kv; ++p) {
      const int64_t id = table[b * max_blocks + p];
      AM_CHECK_ARG(id >= 0 && id < num_blocks, kPaged, "block_table", "values",
                   "physical block ids in [0, num_blocks=" + std::to_string(num_blocks) + ")",
                   "block_table[" + std::to_string(b) + ", " + std::to_string(p) + "]=" + std::to_string(id));
    }
  }
  if (indices.has_value()) {
    // Upstream reads one block-table row per run of equal indices: rows of a run must agree.
    const std::vector<int64_t> ids = to_vector(*indices);
    for (int64_t r = 1; r < B; ++r) {
      const bool same_run = ids[r] == ids[r - 1];
      AM_CHECK_ARG(!same_run || std::equal(table.begin() + r * max_blocks, table.begin() + (r + 1) * max_blocks,
                                           table.begin() + (r - 1) * max_blocks),
                   kPaged, "block_table", "values", "equal rows for query tokens of one request (equal indices)",
                   "rows " + std::to_string(r - 1) + " and " + std::to_string(r) + " differ");
    }
  }
  const at::ScalarType acc = acc_dtype(q);
  at::Tensor out =
      at::full({B * next_n, max_context_len}, -std::numeric_limits<double>::infinity(), q.options().dtype(acc));
  if (acc == at::kDouble) {
    paged_forward<double>(rows_of(q), rows_of(q_sf), gq, kv_cache, f, weights, lens, table, max_blocks, B, next_n, H, D,
                          false, out);
  } else {
    paged_forward<float>(rows_of(q), rows_of(q_sf), gq, kv_cache, f, weights, lens, table, max_blocks, B, next_n, H, D,
                         out_t == at::kBFloat16, out);
  }
  return out.scalar_type() == out_t ? out : out.to(out_t);
}

// ---- schedule metadata ----

at::Tensor paged_mqa_logits_metadata_cpu(const at::Tensor& context_lens, int64_t block_kv, int64_t num_sms,
                                         const std::optional<at::Tensor>& indices) {
  check_rank(kMetadata, "context_lens", context_lens, 2, "[B, next_n] (visible KV tokens per query token)");
  AM_CHECK_ARG(context_lens.scalar_type() == at::kInt, kMetadata, "context_lens", "dtype", "torch.int32",
               dtype_name(context_lens.scalar_type()));
  check_int_arg(kMetadata, "block_kv", block_kv, 1);
  check_int_arg(kMetadata, "num_sms", num_sms, 1);
  if (indices.has_value()) {
    check_rank(kMetadata, "indices", *indices, 1, "[B] (request id per query token)");
    AM_CHECK_ARG(indices->scalar_type() == at::kInt, kMetadata, "indices", "dtype", "torch.int32",
                 dtype_name(indices->scalar_type()));
    check_dim_size(kMetadata, "indices", *indices, 0, "B", context_lens.size(0), "context_lens.size(0)");
  }
  // Requests: batch rows, or runs of equal indices (varlen). A request's KV extent is its last token's length;
  // its work is ceil(extent / 256) units per query token it schedules separately (each token of a varlen run).
  const std::vector<int64_t> lens = to_vector(context_lens);
  const int64_t B = context_lens.size(0), next_n = context_lens.size(1);
  check_context_lens_values(kMetadata, lens, next_n);
  std::vector<int64_t> ids = indices.has_value() ? to_vector(*indices) : std::vector<int64_t>();
  std::vector<int64_t> units;
  for (int64_t b = 0; b < B;) {
    int64_t e = b + 1;
    while (indices.has_value() && e < B && ids[e] == ids[b]) ++e;
    const int64_t extent = next_n > 0 ? lens[(e - 1) * next_n + next_n - 1] : 0;
    units.push_back((extent + kScheduleSplit - 1) / kScheduleSplit * (e - b));
    b = e;
  }
  int64_t total = 0;
  for (int64_t u : units) total += u;
  at::Tensor meta = at::empty({num_sms + 1, 2}, context_lens.options().device(at::kCPU));
  int32_t* m = meta.data_ptr<int32_t>();
  int64_t request = 0, consumed = 0;  // units before `request`
  for (int64_t sm = 0; sm <= num_sms; ++sm) {
    const int64_t start = sm * (total / num_sms) + std::min(sm, total % num_sms);
    while (request < static_cast<int64_t>(units.size()) && consumed + units[request] <= start && start < total) {
      consumed += units[request++];
    }
    const bool done = start >= total;
    m[2 * sm] = static_cast<int32_t>(done ? static_cast<int64_t>(units.size()) : request);
    m[2 * sm + 1] = static_cast<int32_t>(done ? 0 : start - consumed);
  }
  return meta.to(context_lens.device());
}

// ---- top-k selection over the logits ----

// The first min(topk, c1 - c0) of columns [c0, c1) in `cand`, largest key first (NaN counts as +inf), ties to the
// lower column: deterministic. Returns how many.
template <typename Key>
int64_t rank_topk(int64_t c0, int64_t c1, int64_t topk, Key key, std::vector<int64_t>& cand) {
  cand.resize(std::max<int64_t>(c1 - c0, 0));
  for (int64_t c = c0; c < c1; ++c) cand[c - c0] = c;
  const int64_t n = std::min<int64_t>(topk, static_cast<int64_t>(cand.size()));
  auto safe = [&](int64_t c) {
    const double x = key(c);
    return std::isnan(x) ? std::numeric_limits<double>::infinity() : x;
  };
  std::partial_sort(cand.begin(), cand.begin() + n, cand.end(), [&](int64_t a, int64_t b) {
    const double x = safe(a), y = safe(b);
    return x != y ? x > y : a < b;
  });
  return n;
}

template <typename T>
void topk_rows(const at::Tensor& logits, const std::vector<int64_t>& ks, const std::vector<int64_t>& ke, int64_t topk,
               bool compressed, at::Tensor& idx, at::Tensor& val) {
  const int64_t S = logits.size(0), ncols = logits.size(1);
  const T* lp = logits.const_data_ptr<T>();
  int32_t* ip = idx.data_ptr<int32_t>();
  T* vp = val.data_ptr<T>();
  at::parallel_for(0, S, 16, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> cand;
    for (int64_t i = r0; i < r1; ++i) {
      // Columns c of row i hold KV position j = c (full) or ks[i] + c (compressed).
      const int64_t c0 = compressed ? 0 : ks[i], c1 = compressed ? ke[i] - ks[i] : ke[i];
      const T* row = lp + i * ncols;
      const int64_t n = rank_topk(c0, c1, topk, [&](int64_t c) { return static_cast<double>(row[c]); }, cand);
      for (int64_t t = 0; t < topk; ++t) {
        const bool have = t < n;
        ip[i * topk + t] = have ? static_cast<int32_t>(compressed ? cand[t] + ks[i] : cand[t]) : -1;
        vp[i * topk + t] = have ? row[cand[t]] : -std::numeric_limits<T>::infinity();
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> mqa_topk_cpu(const at::Tensor& logits, const at::Tensor& ks, const at::Tensor& ke,
                                                int64_t topk, bool compressed) {
  check_rank(kTopk, "logits", logits, 2, "[S, columns]");
  AM_CHECK_ARG(is_float_operand(logits.scalar_type()), kTopk, "logits", "dtype",
               "torch.bfloat16, torch.float32 or torch.float64", dtype_name(logits.scalar_type()));
  auto check_vector = [&](const char* name, const at::Tensor& t) {
    check_rank(kTopk, name, t, 1, "[S] (one per query)");
    AM_CHECK_ARG(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, kTopk, name, "dtype",
                 "torch.int32 or torch.int64", dtype_name(t.scalar_type()));
    AM_CHECK_ARG(t.device() == logits.device(), kTopk, name, "device",
                 logits.device().str() + " (same as 'logits')", t.device().str());
    check_dim_size(kTopk, name, t, 0, "S", logits.size(0), "logits.size(0)");
  };
  check_vector("ks", ks);
  check_vector("ke", ke);
  check_int_arg(kTopk, "topk", topk, 1);
  const std::vector<int64_t> ksv = to_vector(ks), kev = to_vector(ke);
  for (size_t i = 0; i < ksv.size(); ++i) {
    const std::string at_i = "[" + std::to_string(i) + "]";
    AM_CHECK_ARG(ksv[i] >= 0 && ksv[i] <= kev[i], kTopk, "ks", "values", "0 <= ks[i] <= ke[i]",
                 "ks" + at_i + "=" + std::to_string(ksv[i]) + ", ke" + at_i + "=" + std::to_string(kev[i]));
    const int64_t need = compressed ? kev[i] - ksv[i] : kev[i];
    AM_CHECK_ARG(need <= logits.size(1), kTopk, "ke", "values",
                 std::string(compressed ? "ke[i] - ks[i]" : "ke[i]") + " <= logits.size(1)=" +
                     std::to_string(logits.size(1)),
                 "ke" + at_i + "=" + std::to_string(kev[i]));
  }
  const at::Tensor lc = logits.contiguous();
  at::Tensor idx = at::empty({logits.size(0), topk}, logits.options().dtype(at::kInt));
  at::Tensor val = at::empty({logits.size(0), topk}, logits.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, logits.scalar_type(), "mqa_topk",
                                 [&] { topk_rows<scalar_t>(lc, ksv, kev, topk, compressed, idx, val); });
  return {val, idx};
}

// ---- logits fused with their top-k ----

// mqa_topk(mqa_logits(...)) without the [S, S_kv] logits: each query tile's logits go to a per-thread [tile, span]
// buffer (the same tiles, chunks and arithmetic as mqa_forward, so the same values), and each query's top-k is
// taken there. Keys are the values rounded to the logits dtype (what mqa_topk ranks); `val` holds the unrounded
// values in `T` (rounded once by the caller, as mqa_logits' output is).
template <typename T>
void mqa_topk_forward(const at::Tensor& q2, const std::optional<at::Tensor>& qsf2, int64_t gq, const at::Tensor& kd,
                      const at::Tensor& w, const std::vector<int64_t>& ks, const std::vector<int64_t>& ke, int64_t H,
                      int64_t topk, bool bf16_logits, at::Tensor& val, at::Tensor& idx) {
  const int64_t S = static_cast<int64_t>(ks.size()), qt = queries_per_tile(H);
  const at::Tensor wf = w.to(c10::CppTypeToScalarType<T>::value).contiguous();
  T* vp = val.data_ptr<T>();
  int32_t* ip = idx.data_ptr<int32_t>();
  at::parallel_for(0, (S + qt - 1) / qt, 1, [&](int64_t t0, int64_t t1) {
    std::vector<T> row(kChunk), buf;
    std::vector<int64_t> cand;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = t * qt, i1 = std::min(S, i0 + qt);
      const auto [lo, hi] = tile_span(ks, ke, i0, i1);
      const int64_t span = hi > lo ? hi - lo : 0;
      buf.resize((i1 - i0) * span);
      tile_logits<T>(q2, qsf2, gq, kd, wf.const_data_ptr<T>(), ks, ke, H, t, bf16_logits, row,
                     [&](int64_t i, int64_t a, const T* values, int64_t n) {
                       std::memcpy(buf.data() + (i - i0) * span + (a - lo), values, sizeof(T) * n);
                     });
      for (int64_t i = i0; i < i1; ++i) {
        // Buffer column c of query i is KV position lo + c; its range is [ks[i] - lo, ke[i] - lo).
        const T* r = span > 0 ? buf.data() + (i - i0) * span - lo : nullptr;
        auto key = [&](int64_t j) {
          const double x = static_cast<double>(r[j]);
          return bf16_logits ? static_cast<double>(static_cast<float>(c10::BFloat16(static_cast<float>(x)))) : x;
        };
        const int64_t n = ke[i] > ks[i] ? rank_topk(ks[i], ke[i], topk, key, cand) : 0;
        for (int64_t k = 0; k < topk; ++k) {
          ip[i * topk + k] = k < n ? static_cast<int32_t>(cand[k]) : -1;
          vp[i * topk + k] = k < n ? r[cand[k]] : -std::numeric_limits<T>::infinity();
        }
      }
    }
  });
}

std::tuple<at::Tensor, at::Tensor> mqa_logits_topk_cpu(const at::Tensor& q, const std::optional<at::Tensor>& q_sf,
                                                       const at::Tensor& k, const std::optional<at::Tensor>& k_sf,
                                                       const at::Tensor& weights, const at::Tensor& ks,
                                                       const at::Tensor& ke, int64_t topk,
                                                       std::optional<at::ScalarType> logits_dtype) {
  const Shapes sh = check_mqa(kFused, q, q_sf, k, k_sf, weights, ks, ke, 0, logits_dtype);
  check_int_arg(kFused, "topk", topk, 1);
  const std::vector<int64_t> ksv = to_vector(ks), kev = to_vector(ke);
  check_ranges(kFused, ksv, kev, sh.S_kv, 0);
  const at::ScalarType acc = acc_dtype(q);
  at::Tensor val = at::empty({sh.S, topk}, q.options().dtype(acc));
  at::Tensor idx = at::empty({sh.S, topk}, q.options().dtype(at::kInt));
  const at::Tensor kd = dequantize(rows_of(k), rows_of(k_sf), sh.gk, 0, sh.S_kv, acc);
  const bool bf16 = sh.out_t == at::kBFloat16;
  if (acc == at::kDouble) {
    mqa_topk_forward<double>(rows_of(q), rows_of(q_sf), sh.gq, kd, weights, ksv, kev, sh.H, topk, bf16, val, idx);
  } else {
    mqa_topk_forward<float>(rows_of(q), rows_of(q_sf), sh.gq, kd, weights, ksv, kev, sh.H, topk, bf16, val, idx);
  }
  return {val.scalar_type() == sh.out_t ? val : val.to(sh.out_t), idx};
}

// ---- sparse: DeepSeek V4.1's hierarchical indexer scores only candidate KV blocks (specs/upstream_2609.md §1) ----
//
// Row r has n_r = min(num_blocks, ceil(len_r / SBK)) valid slots (len_r: its KV range's length); column s * SBK + o of
// a valid slot s scores KV token start(block_indices[r, s]) + o where that token lies in the row's range, and every
// other column is exactly -inf (DeepGEMM leaves them unwritten). The slots past n_r are never read (callers pad them
// with anything: repeats, INT32_MAX). Scores are the dense ops' (score_block, reduce_scores), so a sparse logit has
// the bits of the dense logit of the same token.

// block_indices [rows, num_blocks] int32 next to q; returns num_blocks.
int64_t check_sparse_indices(const char* op, const at::Tensor& bi, int64_t rows, const char* rows_what,
                             const char* rows_source, int64_t sbk, const at::Tensor& q) {
  check_rank(op, "block_indices", bi, 2, "[rows, num_blocks] (candidate KV blocks per query row)");
  AM_CHECK_ARG(bi.scalar_type() == at::kInt, op, "block_indices", "dtype", "torch.int32",
               dtype_name(bi.scalar_type()));
  AM_CHECK_ARG(bi.device() == q.device(), op, "block_indices", "device", q.device().str() + " (same as 'q')",
               bi.device().str());
  check_dim_size(op, "block_indices", bi, 0, rows_what, rows, rows_source);
  check_int_arg(op, "sparse_block_kv", sbk, 1);
  const int64_t nb = bi.size(1);
  AM_CHECK_ARG(nb <= kMaxIntArg / sbk, op, "sparse_block_kv", "value",
               "num_blocks * sparse_block_kv <= 2147483647 (the output's columns)",
               std::to_string(sbk) + " with num_blocks=" + std::to_string(nb));
  return nb;
}

// Row r's valid slots: strictly increasing block ids, each block [id * SBK + shift, + SBK) overlapping [lo, hi).
int64_t check_sparse_row(const char* op, const std::vector<int64_t>& idx, int64_t nb, int64_t sbk, int64_t r,
                         int64_t lo, int64_t hi, int64_t shift) {
  const int64_t n = std::min(nb, (hi - lo + sbk - 1) / sbk);
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

// The rows' logits; keys(r, tokens) returns the dequantized keys [n, D] (acc dtype) of row r's tokens.
template <typename T, typename Keys>
void sparse_forward(const at::Tensor& q2, const std::optional<at::Tensor>& qsf2, int64_t gq, const at::Tensor& w,
                    const std::vector<int64_t>& idx, const std::vector<int64_t>& lo, const std::vector<int64_t>& hi,
                    const std::vector<int64_t>& shift, int64_t nb, int64_t sbk, int64_t H, bool exact, Keys&& keys,
                    at::Tensor& out) {
  const at::ScalarType acc = c10::CppTypeToScalarType<T>::value;
  const int64_t rows = static_cast<int64_t>(lo.size()), ncols = out.size(1);
  const at::Tensor wf = w.to(acc).contiguous();
  const T* wp = wf.const_data_ptr<T>();
  T* op = out.data_ptr<T>();
  at::parallel_for(0, rows, 1, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> tokens, cols;
    std::vector<T> row;
    for (int64_t r = r0; r < r1; ++r) {
      tokens.clear();
      cols.clear();
      const int64_t n = std::min(nb, (hi[r] - lo[r] + sbk - 1) / sbk);
      for (int64_t s = 0; s < n; ++s) {
        const int64_t a = idx[r * nb + s] * sbk + shift[r];
        for (int64_t o = std::max<int64_t>(0, lo[r] - a); o < std::min(sbk, hi[r] - a); ++o) {
          tokens.push_back(a + o);
          cols.push_back(s * sbk + o);
        }
      }
      if (tokens.empty()) continue;
      const int64_t m = static_cast<int64_t>(tokens.size());
      const at::Tensor qd = dequantize(q2, qsf2, gq, r * H, H, acc);
      const at::Tensor s = score_block(qd, keys(r, tokens), exact);  // [H, m]
      row.resize(m);
      reduce_scores<T>(s, 0, 0, wp + r * H, H, m, row.data());
      for (int64_t c = 0; c < m; ++c) op[r * ncols + cols[c]] = row[c];
    }
  });
}

at::Tensor sparse_mqa_logits_cpu(const at::Tensor& q, const std::optional<at::Tensor>& q_sf, const at::Tensor& k,
                                 const std::optional<at::Tensor>& k_sf, const at::Tensor& weights, const at::Tensor& ks,
                                 const at::Tensor& ke, const at::Tensor& block_indices, int64_t sparse_block_kv,
                                 bool unaligned_ks, std::optional<at::ScalarType> logits_dtype) {
  const Shapes sh = check_mqa(kSparse, q, q_sf, k, k_sf, weights, ks, ke, 0, logits_dtype);
  const int64_t sbk = sparse_block_kv;
  const int64_t nb = check_sparse_indices(kSparse, block_indices, sh.S, "S", "q.size(0)", sbk, q);
  const std::vector<int64_t> ksv = to_vector(ks), kev = to_vector(ke), idx = to_vector(block_indices);
  check_ranges(kSparse, ksv, kev, sh.S_kv, 0);
  std::vector<int64_t> shift(sh.S, 0);
  for (int64_t i = 0; i < sh.S; ++i) {
    if (unaligned_ks) {
      shift[i] = ksv[i] % sbk;
    } else {
      AM_CHECK_ARG(kev[i] == ksv[i] || ksv[i] % sbk == 0, kSparse, "ks", "values",
                   "multiples of sparse_block_kv=" + std::to_string(sbk) +
                       " for non-empty ranges (aligned blocks; unaligned_ks=True otherwise)",
                   "ks[" + std::to_string(i) + "]=" + std::to_string(ksv[i]));
    }
    check_sparse_row(kSparse, idx, nb, sbk, i, ksv[i], kev[i], shift[i]);
  }
  const at::ScalarType acc = acc_dtype(q);
  at::Tensor out = at::full({sh.S, nb * sbk}, -std::numeric_limits<double>::infinity(), q.options().dtype(acc));
  const at::Tensor kd = dequantize(rows_of(k), rows_of(k_sf), sh.gk, 0, sh.S_kv, acc);
  auto keys = [&](int64_t, const std::vector<int64_t>& tokens) {
    const at::Tensor ids = at::tensor(at::IntArrayRef(tokens), at::TensorOptions().dtype(at::kLong));
    return kd.index_select(0, ids);
  };
  if (acc == at::kDouble) {
    sparse_forward<double>(rows_of(q), rows_of(q_sf), sh.gq, weights, idx, ksv, kev, shift, nb, sbk, sh.H, false, keys,
                           out);
  } else {
    sparse_forward<float>(rows_of(q), rows_of(q_sf), sh.gq, weights, idx, ksv, kev, shift, nb, sbk, sh.H,
                          sh.out_t == at::kBFloat16, keys, out);
  }
  return out.scalar_type() == sh.out_t ? out : out.to(sh.out_t);
}

at::Tensor paged_sparse_mqa_logits_cpu(const at::Tensor& q, const std::optional<at::Tensor>& q_sf,
                                       const at::Tensor& kv_cache, const at::Tensor& weights,
                                       const at::Tensor& context_lens, const at::Tensor& block_table,
                                       const at::Tensor& block_indices, int64_t sparse_block_kv, bool ascend_kv_layout,
                                       std::optional<at::ScalarType> logits_dtype) {
  const char* op = kPagedSparse;
  const int64_t gq =
      check_operand(op, "q", "q_sf", q, q_sf, 4, "[B, next_n, H, D] (or [B, next_n, H, D/2] packed FP4)", q);
  const int64_t B = q.size(0), next_n = q.size(1), H = q.size(2), D = logical_k(q);
  AM_CHECK_ARG(next_n > 0 && H > 0 && D > 0, op, "q", "shape", "next_n > 0, H > 0, D > 0", shape_str(q.sizes()));
  const CacheFormat f = check_cache(op, kv_cache, D, ascend_kv_layout, q);
  const at::ScalarType out_t = check_weights(op, weights, q, B * next_n, H, "B * next_n", logits_dtype);
  check_tables(op, context_lens, block_table, B, next_n);
  const int64_t sbk = sparse_block_kv, rows = B * next_n;
  const int64_t nb = check_sparse_indices(op, block_indices, rows, "B * next_n", "q.size(0) * q.size(1)", sbk, q);
  AM_CHECK_ARG(f.block_kv % sbk == 0, op, "sparse_block_kv", "value",
               "a divisor of the cache's block_kv=" + std::to_string(f.block_kv), sbk);
  const std::vector<int64_t> lens = to_vector(context_lens), table = to_vector(block_table);
  const std::vector<int64_t> idx = to_vector(block_indices);
  const int64_t max_blocks = block_table.size(1), num_blocks = kv_cache.size(0);
  check_context_lens_values(op, lens, next_n);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t L = lens[r], b = r / next_n;
    AM_CHECK_ARG(L <= max_blocks * f.block_kv, op, "context_lens", "values",
                 "context_lens[b, t] <= block_table.size(1) * block_kv=" + std::to_string(max_blocks * f.block_kv),
                 "context_lens[" + std::to_string(b) + ", " + std::to_string(r % next_n) + "]=" + std::to_string(L));
    const int64_t n = check_sparse_row(op, idx, nb, sbk, r, 0, L, 0);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t p = idx[r * nb + s] * sbk / f.block_kv, id = table[b * max_blocks + p];
      AM_CHECK_ARG(id >= 0 && id < num_blocks, op, "block_table", "values",
                   "physical block ids in [0, num_blocks=" + std::to_string(num_blocks) + ")",
                   "block_table[" + std::to_string(b) + ", " + std::to_string(p) + "]=" + std::to_string(id));
    }
  }
  const at::ScalarType acc = acc_dtype(q);
  at::Tensor out = at::full({rows, nb * sbk}, -std::numeric_limits<double>::infinity(), q.options().dtype(acc));
  const uint8_t* base = kv_cache.const_data_ptr<uint8_t>();
  auto keys = [&](int64_t r, const std::vector<int64_t>& tokens) {
    // Runs of consecutive tokens inside one cache block are dequantized together (dequantize_block: the dense
    // kernel's own decoding, so the values are the same floats).
    at::Tensor kf = at::empty({static_cast<int64_t>(tokens.size()), D}, at::kFloat);
    const int64_t b = r / next_n;
    for (size_t c = 0; c < tokens.size();) {
      size_t e = c + 1;
      while (e < tokens.size() && tokens[e] == tokens[e - 1] + 1 && tokens[e] % f.block_kv != 0) ++e;
      const int64_t t = tokens[c], phys = table[b * max_blocks + t / f.block_kv];
      dequantize_block(base + phys * f.block_stride, f, D, static_cast<int64_t>(e - c), kf.data_ptr<float>() + c * D,
                       t % f.block_kv);
      c = e;
    }
    return kf.to(acc);
  };
  const std::vector<int64_t> lo(rows, 0), shift(rows, 0);
  if (acc == at::kDouble) {
    sparse_forward<double>(rows_of(q), rows_of(q_sf), gq, weights, idx, lo, lens, shift, nb, sbk, H, false, keys, out);
  } else {
    sparse_forward<float>(rows_of(q), rows_of(q_sf), gq, weights, idx, lo, lens, shift, nb, sbk, H,
                          out_t == at::kBFloat16, keys, out);
  }
  return out.scalar_type() == out_t ? out : out.to(out_t);
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- mqa_logits family: the DeepSeek sparse-attention indexer (specs/deepgemm_api.md §8) ----
  m.set_python_module("torch_ascend_moe.meta.mqa_logits");
  // logits[i, j] = sum_h weights[i, h] * relu(deq(q)[i, h] . deq(k)[j]) for ks[i] <= j < ke[i], exactly -inf
  // elsewhere: [S, S_kv], or compressed [S, max_seqlen_k] (column t holds j = ks[i] + t) when max_seqlen_k > 0.
  m.def(
      "mqa_logits(Tensor q, Tensor? q_sf, Tensor k, Tensor? k_sf, Tensor weights, Tensor ks, Tensor ke, "
      "int max_seqlen_k=0, ScalarType? logits_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // (dq [S, H, D], dk [S_kv, D], dweights [S, H]) in FP32 (FP64), w.r.t. the dequantized operands; an output
  // whose output_mask entry is false is an empty tensor.
  m.def(
      "mqa_logits_backward(Tensor grad, Tensor q, Tensor? q_sf, Tensor k, Tensor? k_sf, Tensor weights, Tensor ks, "
      "Tensor ke, int max_seqlen_k, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // Decode over a paged FP8/FP4 KV cache: row b * next_n + t scores the first context_lens[b, t] tokens of
  // request b (logical block p in physical block block_table[b, p]); later columns are -inf.
  m.def(
      "paged_mqa_logits(Tensor q, Tensor? q_sf, Tensor kv_cache, Tensor weights, Tensor context_lens, "
      "Tensor block_table, int max_context_len, Tensor? indices=None, bool ascend_kv_layout=False, "
      "ScalarType? logits_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // The paged kernel's work schedule: int32 [num_sms + 1, 2] (request, KV split) start per SM.
  m.def(
      "paged_mqa_logits_metadata(Tensor context_lens, int block_kv, int num_sms, Tensor? indices=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Top-k KV positions per query inside [ks, ke) (largest first, ties to the lower position), as torch.topk:
  // (values [S, topk], -inf padded; indices int32 [S, topk], absolute KV positions, -1 padded).
  m.def("mqa_topk(Tensor logits, Tensor ks, Tensor ke, int topk, bool compressed=False) -> (Tensor, Tensor)",
        {at::Tag::pt2_compliant_tag});
  // mqa_topk(mqa_logits(q, q_sf, k, k_sf, weights, ks, ke, 0, logits_dtype), ks, ke, topk) in one op: (values
  // [S, topk] in the logits dtype, indices int32 [S, topk]), never holding the [S, S_kv] logits (the indexer's
  // output without its O(S * S_kv) memory; Ascend's npu_lightning_indexer computes the same pair).
  m.def(
      "mqa_logits_topk(Tensor q, Tensor? q_sf, Tensor k, Tensor? k_sf, Tensor weights, Tensor ks, Tensor ke, "
      "int topk, ScalarType? logits_dtype=None) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // DeepSeek V4.1's sparse indexer (DeepGEMM 2.8's fp8_fp4_sparse_mqa_logits): [S, num_blocks * sparse_block_kv],
  // column s * SBK + o scoring KV token block_indices[i, s] * SBK + o (+ ks[i] % SBK with unaligned_ks) inside
  // [ks[i], ke[i]) for the first min(num_blocks, ceil((ke[i] - ks[i]) / SBK)) slots; exactly -inf elsewhere.
  m.def(
      "sparse_mqa_logits(Tensor q, Tensor? q_sf, Tensor k, Tensor? k_sf, Tensor weights, Tensor ks, Tensor ke, "
      "Tensor block_indices, int sparse_block_kv, bool unaligned_ks=False, ScalarType? logits_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // The same over a paged cache (fp8_fp4_paged_sparse_mqa_logits): row b * next_n + t, logical block ids of request
  // b's context (its first context_lens[b, t] tokens), [B * next_n, num_blocks * sparse_block_kv].
  m.def(
      "paged_sparse_mqa_logits(Tensor q, Tensor? q_sf, Tensor kv_cache, Tensor weights, Tensor context_lens, "
      "Tensor block_table, Tensor block_indices, int sparse_block_kv, bool ascend_kv_layout=False, "
      "ScalarType? logits_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) {
  m.impl("mqa_logits", &mqa_logits_cpu);
  m.impl("mqa_logits_backward", &mqa_logits_backward_cpu);
  m.impl("paged_mqa_logits", &paged_mqa_logits_cpu);
  m.impl("paged_mqa_logits_metadata", &paged_mqa_logits_metadata_cpu);
  m.impl("mqa_topk", &mqa_topk_cpu);
  m.impl("mqa_logits_topk", &mqa_logits_topk_cpu);
  m.impl("sparse_mqa_logits", &sparse_mqa_logits_cpu);
  m.impl("paged_sparse_mqa_logits", &paged_sparse_mqa_logits_cpu);
}

}  // namespace ascend_moe
