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

#include "fp8_gemm.h"
#include "mqa_logits_checks.h"
#include "vector_clones.h"

namespace ascend_moe {
namespace {

constexpr int64_t kTileRows = 256;  // (query, head) rows per score block
constexpr int64_t kChunk = 512;     // KV tokens per score block
constexpr int64_t kScheduleSplit = 256;  // KV tokens per unit of the paged schedule (upstream's split)

using mqa_logits::acc_dtype;
using mqa_logits::CacheFormat;
using mqa_logits::is_quantized;
using mqa_logits::MqaShapes;
using mqa_logits::to_vector;

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
  const MqaShapes sh =
      mqa_logits::mqa_signature(mqa_logits::kOp, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k, logits_dtype);
  const std::vector<int64_t> ksv = to_vector(ks), kev = to_vector(ke);
  mqa_logits::check_range_values(mqa_logits::kOp, ksv, kev, sh.S_kv, max_seqlen_k);
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
  const MqaShapes sh = mqa_logits::backward_signature(grad, q, q_sf, k, k_sf, weights, ks, ke, max_seqlen_k);
  const std::vector<int64_t> ksv = to_vector(ks), kev = to_vector(ke);
  mqa_logits::check_range_values(mqa_logits::kBackward, ksv, kev, sh.S_kv, max_seqlen_k);
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

at::Tensor paged_mqa_logits_cpu(const at::Tensor& q, const std::optional<at::Tensor>& q_sf, const at::Tensor& kv_cache,
                                const at::Tensor& weights, const at::Tensor& context_lens,
                                const at::Tensor& block_table, int64_t max_context_len,
                                const std::optional<at::Tensor>& indices, bool ascend_kv_layout,
                                std::optional<at::ScalarType> logits_dtype) {
  const auto [gq, f, out_t] = mqa_logits::paged_signature(q, q_sf, kv_cache, weights, context_lens, block_table,
                                                          max_context_len, indices, ascend_kv_layout, logits_dtype);
  const int64_t B = q.size(0), next_n = q.size(1), H = q.size(2), D = logical_k(q);
  const std::vector<int64_t> lens = to_vector(context_lens), table = to_vector(block_table);
  const int64_t max_blocks = block_table.size(1);
  mqa_logits::check_paged_values(lens, table, next_n, max_blocks, max_context_len, f.block_kv, kv_cache.size(0),
                                 indices);
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
  mqa_logits::metadata_signature(context_lens, block_kv, num_sms, indices);
  // Requests: batch rows, or runs of equal indices (varlen). A request's KV extent is its last token's length;
  // its work is ceil(extent / 256) units per query token it schedules separately (each token of a varlen run).
  const std::vector<int64_t> lens = to_vector(context_lens);
  const int64_t B = context_lens.size(0), next_n = context_lens.size(1);
  mqa_logits::check_context_lens_values(mqa_logits::kMetadata, lens, next_n);
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
  mqa_logits::topk_signature(logits, ks, ke, topk);
  const std::vector<int64_t> ksv = to_vector(ks), kev = to_vector(ke);
  mqa_logits::check_topk_values(ksv, kev, logits.size(1), compressed);
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
  const MqaShapes sh = mqa_logits::fused_signature(q, q_sf, k, k_sf, weights, ks, ke, topk, logits_dtype);
  const std::vector<int64_t> ksv = to_vector(ks), kev = to_vector(ke);
  mqa_logits::check_range_values(mqa_logits::kFused, ksv, kev, sh.S_kv, 0);
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
  const auto [sh, nb] = mqa_logits::sparse_signature(q, q_sf, k, k_sf, weights, ks, ke, block_indices,
                                                      sparse_block_kv, logits_dtype);
  const int64_t sbk = sparse_block_kv;
  const std::vector<int64_t> ksv = to_vector(ks), kev = to_vector(ke), idx = to_vector(block_indices);
  mqa_logits::check_sparse_values(ksv, kev, idx, nb, sbk, unaligned_ks, sh.S_kv);
  std::vector<int64_t> shift(sh.S, 0);
  if (unaligned_ks) {
    for (int64_t i = 0; i < sh.S; ++i) shift[i] = ksv[i] % sbk;
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
  const auto [gq, f, out_t, nb] = mqa_logits::paged_sparse_signature(
      q, q_sf, kv_cache, weights, context_lens, block_table, block_indices, sparse_block_kv, ascend_kv_layout,
      logits_dtype);
  const int64_t B = q.size(0), next_n = q.size(1), H = q.size(2), D = logical_k(q);
  const int64_t sbk = sparse_block_kv, rows = B * next_n;
  const std::vector<int64_t> lens = to_vector(context_lens), table = to_vector(block_table);
  const std::vector<int64_t> idx = to_vector(block_indices);
  const int64_t max_blocks = block_table.size(1);
  mqa_logits::check_paged_sparse_values(lens, table, idx, next_n, max_blocks, nb, sbk, f.block_kv, kv_cache.size(0));
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
  m.set_python_module("torch_ascend_moe.fakes.mqa_logits");
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
