// CPU kernel of the hc_prenorm family: DeepGEMM's mHC pre-norm GEMM (specs/deepgemm_api.md §9).
//
// d = float(a) @ tf32(b)^T and sqr_sum = sum_k float(a)^2, the raw projection and the sum of squares of the
// flattened residual streams (the RMS normalisation is applied afterwards). b is rounded to TF32 (10-bit
// mantissa, round to nearest, ties away from zero: what the tensor-core kernel multiplies) so results
// match the GPU kernel's numerics; FP64 inputs skip the rounding (gradcheck). With num_splits = S the
// reduction is cut into 64-wide blocks and each split's partial sums go to d[s], sqr_sum[s].
#include <ATen/core/Tensor.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <string>
#include <tuple>

#include "hc_prenorm_checks.h"

namespace ascend_moe {
namespace {

using hc_prenorm::kBlockK;

at::Tensor round_to_tf32(const at::Tensor& x) {
  const at::Tensor bits = x.contiguous().view(at::kInt);
  // Adding half an ULP of TF32 to the magnitude bits and truncating rounds half away from zero.
  const at::Tensor rounded = bits.add(0x1000).bitwise_and(~0x1FFF).view(at::kFloat);
  return at::where(x.isfinite(), rounded, x);
}

std::tuple<at::Tensor, at::Tensor> hc_prenorm_gemm_cpu(const at::Tensor& a, const at::Tensor& b,
                                                       std::optional<int64_t> num_splits) {
  const at::ScalarType acc_t = hc_prenorm::hc_prenorm_signature(a, b, num_splits);
  const bool fp64 = acc_t == at::kDouble;
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  const at::Tensor a_f = a.to(acc_t);
  const at::Tensor b_r = fp64 ? b : round_to_tf32(b);
  if (!num_splits.has_value()) {
    return {at::mm(a_f, b_r.t()), a_f.square().sum(-1)};
  }
  const int64_t S = *num_splits, nb = K / kBlockK;
  at::Tensor d = at::zeros({S, M, N}, a.options().dtype(acc_t));
  at::Tensor sqr = at::zeros({S, M}, a.options().dtype(acc_t));
  for (int64_t s = 0; s < S; ++s) {
    const int64_t first = s * (nb / S) + std::min(s, nb % S), blocks = nb / S + (s < nb % S ? 1 : 0);
    if (blocks == 0 || M == 0) continue;
    const at::Tensor a_s = a_f.narrow(1, first * kBlockK, blocks * kBlockK);
    at::Tensor d_s = d.select(0, s);
    at::mm_out(d_s, a_s, b_r.narrow(1, first * kBlockK, blocks * kBlockK).t());
    sqr.select(0, s).copy_(a_s.square().sum(-1));
  }
  return {d, sqr};
}

}  // namespace

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- hc_prenorm family: mHC pre-norm GEMM (d = a @ tf32(b)^T, sqr_sum = sum_k a^2; per-split partials) ----
  m.set_python_module("torch_ascend_moe.fakes.hc_prenorm");
  m.def("hc_prenorm_gemm(Tensor a, Tensor b, int? num_splits=None) -> (Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) { m.impl("hc_prenorm_gemm", &hc_prenorm_gemm_cpu); }

}  // namespace ascend_moe
