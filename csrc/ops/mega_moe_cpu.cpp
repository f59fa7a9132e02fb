// mega_moe's eager CPU loops: the SwiGLU step between the two grouped GEMMs (steps 4-5 of
// torch_ascend_moe/backends/portable/mega_moe.py, ``_activation`` in BF16 mode) and the backward autograd would
// record for it (``_KeptActivation``), row block by row block with the block's FP32 values in per-thread scratch.
// The portable composition makes five passes over [N, I] FP32 tensors forward and about thirteen backward; here
// each block is loaded once and its FP32 temporaries stay in cache (issue 51: the fused module trains at least as
// fast as the unfused one).
//
// The same bits as the composition: the transcendental steps are ATen's own kernels on the block's buffer (silu_,
// silu_backward_out; the weight gradient's row sums are ATen's sum over the row, whose order depends only on the
// row), every other step is one IEEE operation in the composition's order (this file is built without FMA
// contraction: no a * b + c expression), and blocks start at multiples of 64 elements, so ATen's vector loops give
// each element the lane it has in the whole-tensor call (a NaN rounds to BF16 as those lanes write it: 0xFFFF, not
// c10's scalar 0x7FC0). The clamp's bound is the BF16 value of c, as torch's
// clamp and comparisons of a BF16 tensor with a Python float use it.
//
// Also here: steps 2-7 of a single-process BF16 call that records no autograd as one call (mega_moe_bf16_local),
// the pipeline's own kernels one after another without Python between them (issue 51).
//
// Private to that module (the eager, plain-tensor path: _registry._plain_call), not operators: Python calls them
// as torch_ascend_moe._C._kept_swiglu / _kept_swiglu_backward / _mega_moe_bf16_local / _k_grouped_bf16_gemm_into.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tensor.h>
#include <c10/util/BFloat16.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <vector>

#include "gemm.h"
#include "grouped.h"
#include "moe_routing.h"
#include "rows.h"
#include "tasks.h"
#include "vector_clones.h"

namespace ascend_moe {
namespace {

// gate = min(gate, c), up = clamp(up, -c, c): torch.clamp's results on the BF16 halves, read back in FP32. A NaN
// stays NaN with the bits ATen's vector cast back to BF16 gives it (0xFFFF), which the weight gradient's FP32 sums
// carry to the end.
AM_VECTOR_CLONES void clamp_halves(float* gate, float* up, int64_t n, float c) {
  const float nan = float_of(uint32_t{kVectorCastNaN} << 16);
  for (int64_t j = 0; j < n; ++j) {
    const float x = gate[j], y = up[j];
    gate[j] = x > c ? c : (x != x ? nan : x);
    up[j] = y > c ? c : (y < -c ? -c : (y != y ? nan : y));
  }
}

AM_VECTOR_CLONES void product(const float* a, const float* b, int64_t n, float* out) {
  for (int64_t j = 0; j < n; ++j) out[j] = a[j] * b[j];
}

AM_VECTOR_CLONES void scale(float* a, int64_t n, float w) {
  for (int64_t j = 0; j < n; ++j) a[j] = a[j] * w;
}

// Zero (+0, as masked_fill) where the clamp held the BF16 input x: gate x > c (or NaN), up |x| > c (or NaN).
void zero_held(const uint16_t* x, int64_t n, float c, bool gate, uint16_t* g) {
  for (int64_t j = 0; j < n; ++j) {
    const float v = float_of(static_cast<uint32_t>(x[j]) << 16);
    const bool kept = gate ? v <= c : (v >= -c && v <= c);
    if (!kept) g[j] = 0;
  }
}

// Rows per block: about block_elements values, a multiple of 64 / gcd(I, 64) rows so every block starts at a
// multiple of 64 elements of the [N, I] activation.
int64_t block_rows(int64_t inter, int64_t block_elements) {
  const int64_t step = 64 / std::gcd<int64_t>(std::max<int64_t>(inter, 1), 64);
  return std::max(step, block_elements / std::max<int64_t>(inter, 1) / step * step);
}

struct KeptSwiglu {
  at::Tensor h;                     // [N, 2I] BF16, rows contiguous: gate columns, then up
  std::optional<at::Tensor> w;      // [N] FP32 routing weights
  std::optional<float> clamp;       // the BF16 value of c
  int64_t rows, inter, per_block;

  KeptSwiglu(const at::Tensor& h_in, const std::optional<at::Tensor>& w_in, std::optional<double> c,
             int64_t block_elements)
      : h(h_in.stride(1) == 1 ? h_in : h_in.contiguous()), rows(h_in.size(0)), inter(h_in.size(1) / 2) {
    TORCH_CHECK(h.scalar_type() == at::kBFloat16 && h.dim() == 2 && h.size(1) % 2 == 0 && h.device().is_cpu(),
                "ascend_moe::mega_moe: the kept SwiGLU takes a CPU BF16 [N, 2I] L1 output, got ", h.scalar_type(),
                " ", h.sizes());
    if (w_in.has_value()) {
      TORCH_CHECK(w_in->scalar_type() == at::kFloat && w_in->numel() == rows,
                  "ascend_moe::mega_moe: the kept SwiGLU's row weights must be FP32 [", rows, "], got ",
                  w_in->scalar_type(), " ", w_in->sizes());
      w = w_in->contiguous();
    }
    if (c.has_value()) clamp = static_cast<float>(c10::BFloat16(static_cast<float>(*c)));
    per_block = block_rows(inter, block_elements);
  }

  int64_t blocks() const { return (rows + per_block - 1) / per_block; }
  int64_t threads() const { return threads_for(rows * inter, kWorkPerThread); }
  const uint16_t* gate_row(int64_t r) const {
    return reinterpret_cast<const uint16_t*>(h.const_data_ptr<c10::BFloat16>()) + r * h.stride(0);
  }
  float weight(int64_t r) const { return w.has_value() ? w->const_data_ptr<float>()[r] : 1.0f; }

  // The block's clamped gate and up halves in FP32 (n = rows x I values each, rows contiguous).
  void load(int64_t r0, int64_t r1, float* gate, float* up) const {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = (r - r0) * inter;
      bf16_row_to_float(gate_row(r), inter, gate + o);
      bf16_row_to_float(gate_row(r) + inter, inter, up + o);
    }
    if (clamp.has_value()) clamp_halves(gate, up, (r1 - r0) * inter, *clamp);
  }
};

at::Tensor as_tensor(float* p, at::IntArrayRef sizes) {
  return at::from_blob(p, sizes, at::TensorOptions().dtype(at::kFloat));
}

// act = bf16(silu(gate) * up * w): _activation's values.
at::Tensor kept_swiglu(const at::Tensor& h_in, const std::optional<at::Tensor>& w_in, std::optional<double> c,
                       int64_t block_elements) {
  const KeptSwiglu k(h_in, w_in, c, block_elements);
  at::Tensor out = at::empty({k.rows, k.inter}, k.h.options());
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  parallel_tasks(k.blocks(), k.threads(), [&](int64_t b) {
    const int64_t r0 = b * k.per_block, r1 = std::min(k.rows, r0 + k.per_block), n = (r1 - r0) * k.inter;
    thread_local std::vector<float> buffer;
    float* gate = scratch(buffer, 2 * n);
    float* up = gate + n;
    k.load(r0, r1, gate, up);
    at::Tensor silu = as_tensor(gate, {n});
    at::silu_(silu);
    for (int64_t r = r0; r < r1; ++r) {
      float* y = gate + (r - r0) * k.inter;
      times_up(y, up + (r - r0) * k.inter, k.inter, k.w.has_value(), k.weight(r));
      float_row_to_bf16(y, k.inter, o + r * k.inter, kVectorCastNaN);
    }
  });
  return out;
}

// The backward of kept_swiglu as autograd records _activation: (grad_h [N, 2I] BF16, grad_w [N] FP32 when
// need_w). The steps, per element: F = float(grad), S = silu(G) (G, U the clamped halves in FP32); grad_w = row
// sum of S * U * F; F = F * w; grad_gate = silu_backward(U * F, G); grad_up = S * F; both rounded to BF16 and
// zeroed where the clamp held.
std::tuple<at::Tensor, std::optional<at::Tensor>> kept_swiglu_backward(const at::Tensor& h_in,
                                                                       const std::optional<at::Tensor>& w_in,
                                                                       std::optional<double> c,
                                                                       const at::Tensor& grad_in, bool need_w,
                                                                       int64_t block_elements) {
  const KeptSwiglu k(h_in, w_in, c, block_elements);
  const at::Tensor grad = grad_in.scalar_type() == at::kBFloat16 && grad_in.is_contiguous()
                              ? grad_in
                              : grad_in.to(at::kBFloat16).contiguous();
  TORCH_CHECK(grad.dim() == 2 && grad.size(0) == k.rows && grad.size(1) == k.inter,
              "ascend_moe::mega_moe: the kept SwiGLU's gradient must be [", k.rows, ", ", k.inter, "], got ",
              grad.sizes());
  need_w = need_w && k.w.has_value();
  at::Tensor grad_h = at::empty({k.rows, 2 * k.inter}, k.h.options());
  std::optional<at::Tensor> grad_w;
  if (need_w) grad_w = at::empty({k.rows}, k.w->options());
  uint16_t* gh = reinterpret_cast<uint16_t*>(grad_h.data_ptr<c10::BFloat16>());
  const uint16_t* g = reinterpret_cast<const uint16_t*>(grad.const_data_ptr<c10::BFloat16>());
  parallel_tasks(k.blocks(), k.threads(), [&](int64_t b) {
    const int64_t r0 = b * k.per_block, r1 = std::min(k.rows, r0 + k.per_block), n = (r1 - r0) * k.inter;
    thread_local std::vector<float> buffer;
    float* G = scratch(buffer, 4 * n);
    float *U = G + n, *F = U + n, *S = F + n;
    k.load(r0, r1, G, U);
    bf16_row_to_float(g + r0 * k.inter, n, F);
    std::copy(G, G + n, S);
    at::Tensor silu = as_tensor(S, {n});
    at::silu_(silu);
    if (need_w) {
      thread_local std::vector<float> products;  // G, U, F, S are all read again below
      float* P = scratch(products, n);
      product(S, U, n, P);
      product(P, F, n, P);
      at::Tensor out = at::from_blob(grad_w->data_ptr<float>() + r0, {r1 - r0}, k.w->options());
      at::sum_out(out, as_tensor(P, {r1 - r0, k.inter}), {1});
    }
    if (k.w.has_value()) {
      for (int64_t r = r0; r < r1; ++r) scale(F + (r - r0) * k.inter, k.inter, k.weight(r));
    }
    product(U, F, n, U);
    at::Tensor u = as_tensor(U, {n});
    at::silu_backward_out(u, u, as_tensor(G, {n}));
    product(S, F, n, S);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = (r - r0) * k.inter;
      uint16_t* row = gh + r * 2 * k.inter;
      float_row_to_bf16(U + o, k.inter, row, kVectorCastNaN);
      float_row_to_bf16(S + o, k.inter, row + k.inter, kVectorCastNaN);
      if (k.clamp.has_value()) {
        zero_held(k.gate_row(r), k.inter, *k.clamp, true, row);
        zero_held(k.gate_row(r) + k.inter, k.inter, *k.clamp, false, row + k.inter);
      }
    }
  });
  return {grad_h, grad_w};
}

// Steps 2-7 of a single-process BF16 call (the eager path without autograd): the pipeline's ops as C++ calls, with
// nothing between them. Each step is the op's own code (moe_permute's order, m_grouped_bf16_gemm_swiglu's tasks,
// m_grouped_bf16_gemm's jobs, moe_unpermute), so the bits are the pipeline's. The difference: the L1 tasks gather
// their row blocks from x (bf16_swiglu_segments' `source`), so the [T*K, H] expert-ordered copy of x is never
// written and read back. The fused shared experts, where given, are the pipeline's shared_experts with its ops' own
// code: the L1 GEMM on x as passed (bf16_gemm's worker), the SwiGLU step (kept_swiglu, `block_elements` as the
// Python caller's), the L2 GEMM as one more job of the routed L2's call; their row plus zero is the combine's bias
// (_combine_bias). nullopt when an id is outside [-1, E): Python raises the op's error.
std::optional<std::tuple<at::Tensor, at::Tensor>> mega_moe_bf16_local(
    const at::Tensor& x_in, const at::Tensor& topk_idx, const at::Tensor& topk_weights, const at::Tensor& l1_in,
    const at::Tensor& l2_in, std::optional<double> clamp, const std::optional<at::Tensor>& shared_l1,
    const std::optional<at::Tensor>& shared_l2, int64_t block_elements) {
  // Detached: the tasks run ATen ops on worker threads (see m_grouped_bf16_gemm_swiglu_cpu).
  const at::Tensor x = x_in.detach().contiguous(), idx = topk_idx.to(at::kLong).contiguous();
  const at::Tensor l1 = l1_in.detach(), l2 = l2_in.detach();
  const int64_t T = x.size(0), K = idx.size(1), E = l1.size(0), H = x.size(1);
  const int64_t* ids = idx.const_data_ptr<int64_t>();
  std::vector<char> routed(T, 0);
  for (int64_t i = 0; i < T * K; ++i) {
    if (ids[i] < -1 || ids[i] >= E) return std::nullopt;
    if (ids[i] >= 0) routed[i / K] = 1;
  }
  const PermutePlan plan = permute_plan(ids, T, K, E, 1, topk_idx.options());
  const int32_t* offs = plan.offs.const_data_ptr<int32_t>();
  const int64_t P = E ? offs[E - 1] : 0;
  // Each row's token and routing weight (the pipeline's permuted x and moe_permute of the [T*K, 1] weights).
  std::vector<int64_t> source(P);
  at::Tensor row_w = at::empty({P}, topk_weights.options().dtype(at::kFloat));
  const at::Tensor w = topk_weights.detach().contiguous();
  const float* wp = w.const_data_ptr<float>();
  float* rw = row_w.data_ptr<float>();
  const int32_t* rm = plan.row_map.const_data_ptr<int32_t>();
  for (int64_t i = 0; i < T * K; ++i) {
    if (rm[i] < 0) continue;
    source[rm[i]] = i / K;
    rw[rm[i]] = wp[i];
  }
  std::vector<grouped::Segment> segments;
  at::Tensor counts = at::empty({E}, plan.offs.options());
  int32_t* c = counts.data_ptr<int32_t>();
  for (int64_t e = 0; e < E; ++e) {
    segments.push_back({e, plan.starts[e], offs[e]});
    c[e] = static_cast<int32_t>(offs[e] - plan.starts[e]);
  }
  // The subnormal check reads the rows that reach an expert (x's rows unless some token is routed nowhere).
  const bool all_routed = std::all_of(routed.begin(), routed.end(), [](char r) { return r != 0; });
  at::Tensor scanned = x;
  if (!all_routed) {
    std::vector<int64_t> kept;
    for (int64_t t = 0; t < T; ++t) {
      if (routed[t]) kept.push_back(t);
    }
    scanned = x.index_select(0, at::tensor(kept, idx.options()));
  }
  std::optional<at::Tensor> shared_row;
  at::Tensor shared_act;
  if (shared_l1.has_value()) {
    const at::Tensor s1 = shared_l1->detach();
    at::Tensor h = at::empty({T, s1.size(0)}, x.options());
    if (T > 0) matmul_into(h, x_in.detach(), s1, std::nullopt, 1.0);
    shared_act = kept_swiglu(h, std::nullopt, clamp, block_elements);
    shared_row = at::empty({T, H}, x.options());
  }
  const at::Tensor act = std::get<0>(bf16_swiglu_segments(x, source.data(), P, scanned, l1, segments, row_w, clamp, 0,
                                                          false, at::kBFloat16));
  at::Tensor y_rows = at::empty({P, H}, x.options());
  std::vector<MatmulJob> jobs;
  for (const grouped::Segment& seg : segments) {
    if (seg.end == seg.begin) continue;
    const int64_t len = seg.end - seg.begin;
    jobs.push_back({y_rows.narrow(0, seg.begin, len), act.narrow(0, seg.begin, len), l2.select(0, seg.group)});
  }
  if (shared_row.has_value() && T > 0) jobs.push_back({*shared_row, shared_act, shared_l2->detach()});
  matmul_many(jobs);
  if (shared_row.has_value()) shared_row->add_(0.0);
  return std::make_tuple(moe_unpermute_cpu(y_rows, plan.row_map, std::nullopt, shared_row), counts);
}

std::optional<at::Tensor> optional_tensor(PyObject* o) {
  if (o == Py_None) return std::nullopt;
  TORCH_CHECK(THPVariable_Check(o), "ascend_moe::mega_moe: expected a tensor or None");
  return THPVariable_Unpack(o);
}

std::optional<double> optional_float(PyObject* o) {
  if (o == Py_None) return std::nullopt;
  const double v = PyFloat_AsDouble(o);
  if (v == -1.0 && PyErr_Occurred()) throw python_error();
  return v;
}

}  // namespace
}  // namespace ascend_moe

// _kept_swiglu(h, row_w or None, clamp or None, block_elements) -> act
PyObject* ascend_moe_kept_swiglu(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *h, *w, *c;
  Py_ssize_t block;
  if (!PyArg_ParseTuple(args, "OOOn", &h, &w, &c, &block)) return nullptr;
  using namespace ascend_moe;
  at::Tensor out;
  {
    const at::Tensor ht = *optional_tensor(h);
    const auto wt = optional_tensor(w);
    const auto ct = optional_float(c);
    pybind11::gil_scoped_release no_gil;
    out = kept_swiglu(ht, wt, ct, block);
  }
  return THPVariable_Wrap(out);
  END_HANDLE_TH_ERRORS
}

// _kept_swiglu_backward(h, row_w or None, clamp or None, grad_act, need_w, block_elements) -> (grad_h, grad_w or None)
PyObject* ascend_moe_kept_swiglu_backward(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *h, *w, *c, *g;
  int need_w;
  Py_ssize_t block;
  if (!PyArg_ParseTuple(args, "OOOOpn", &h, &w, &c, &g, &need_w, &block)) return nullptr;
  using namespace ascend_moe;
  std::tuple<at::Tensor, std::optional<at::Tensor>> result;
  {
    const at::Tensor ht = *optional_tensor(h), gt = *optional_tensor(g);
    const auto wt = optional_tensor(w);
    const auto ct = optional_float(c);
    pybind11::gil_scoped_release no_gil;
    result = kept_swiglu_backward(ht, wt, ct, gt, need_w != 0, block);
  }
  const auto& [grad_h, grad_w] = result;
  PyObject* gw = grad_w.has_value() ? THPVariable_Wrap(*grad_w) : (Py_INCREF(Py_None), Py_None);
  return Py_BuildValue("(NN)", THPVariable_Wrap(grad_h), gw);
  END_HANDLE_TH_ERRORS
}

// _mega_moe_bf16_local(x, topk_idx, topk_weights, l1, l2, clamp or None, shared_l1 or None, shared_l2 or None,
// block_elements) -> (y, counts) or None
PyObject* ascend_moe_mega_moe_bf16_local(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *x, *idx, *w, *l1, *l2, *c, *s1, *s2;
  long long block_elements = 0;
  if (!PyArg_ParseTuple(args, "OOOOOOOOL", &x, &idx, &w, &l1, &l2, &c, &s1, &s2, &block_elements)) return nullptr;
  using namespace ascend_moe;
  std::optional<std::tuple<at::Tensor, at::Tensor>> result;
  {
    const at::Tensor xt = *optional_tensor(x), it = *optional_tensor(idx), wt = *optional_tensor(w);
    const at::Tensor l1t = *optional_tensor(l1), l2t = *optional_tensor(l2);
    const auto s1t = optional_tensor(s1), s2t = optional_tensor(s2);
    const auto ct = optional_float(c);
    pybind11::gil_scoped_release no_gil;
    result = mega_moe_bf16_local(xt, it, wt, l1t, l2t, ct, s1t, s2t, block_elements);
  }
  if (!result.has_value()) Py_RETURN_NONE;
  const auto& [y, counts] = *result;
  return Py_BuildValue("(NN)", THPVariable_Wrap(y), THPVariable_Wrap(counts));
  END_HANDLE_TH_ERRORS
}

// _k_grouped_bf16_gemm_into(out, a, b, layout, num_groups) -> out: k_grouped_bf16_gemm(a, b, layout, num_groups,
// out_dtype=out.dtype) written into out (mega_moe's eager backward: its experts' weight gradients into reused buffers)
PyObject* ascend_moe_k_grouped_bf16_gemm_into(PyObject*, PyObject* args) {
  HANDLE_TH_ERRORS
  PyObject *out, *a, *b, *layout;
  long long num_groups = 0;
  if (!PyArg_ParseTuple(args, "OOOOL", &out, &a, &b, &layout, &num_groups)) return nullptr;
  using namespace ascend_moe;
  {
    const at::Tensor ot = *optional_tensor(out), at_ = *optional_tensor(a), bt = *optional_tensor(b);
    const at::Tensor lt = *optional_tensor(layout);
    pybind11::gil_scoped_release no_gil;
    k_grouped_bf16_gemm_into(at_, bt, lt, num_groups, true, 1, std::nullopt, ot.scalar_type(), ot);
  }
  Py_INCREF(out);
  return out;
  END_HANDLE_TH_ERRORS
}
