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

#include "checks.h"

namespace ascend_moe {
namespace {

constexpr const char* kOp = "ascend_moe::hc_prenorm_gemm";
constexpr int64_t kBlockK = 64;

at::Tensor round_to_tf32(const at::Tensor& x) {
  const at::Tensor bits = x.contiguous().view(at::kInt);
  // Adding half an ULP of TF32 to the magnitude bits and truncating rounds half away from zero.
  const at::Tensor rounded = bits.add(0x1000).bitwise_and(~0x1FFF).view(at::kFloat);
  return at::where(x.isfinite(), rounded, x);
}

std::tuple<at::Tensor, at::Tensor> hc_prenorm_gemm_cpu(const at::Tensor& a, const at::Tensor& b,
                                                       std::optional<int64_t> num_splits) {
  check_rank(kOp, "a", a, 2, "[M, K]");
  AM_CHECK_ARG(a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kFloat || a.scalar_type() == at::kDouble,
               kOp, "a", "dtype", "torch.bfloat16, torch.float32 or torch.float64", dtype_name(a.scalar_type()));
  check_rank(kOp, "b", b, 2, "[N, K]");
  const bool fp64 = a.scalar_type() == at::kDouble;
  const at::ScalarType acc_t = fp64 ? at::kDouble : at::kFloat;
  AM_CHECK_ARG(b.scalar_type() == acc_t, kOp, "b", "dtype",
               fp64 ? "torch.float64 (with a float64 a)" : "torch.float32", dtype_name(b.scalar_type()));
  check_same_device(kOp, "b", b, a);
  check_dim_size(kOp, "b", b, 1, "K", a.size(1), "a.size(1)");
  const int64_t M = a.size(0), N = b.size(0), K = a.size(1);
  AM_CHECK_ARG(K % kBlockK == 0, kOp, "a", "size(1) (K)", "a multiple of 64", K);
  if (num_splits.has_value()) {
    AM_CHECK_ARG(*num_splits > 0, kOp, "num_splits", "value", "None or a positive integer", *num_splits);
    AM_CHECK_ARG(*num_splits <= kMaxIntArg, kOp, "num_splits", "value",
                 "at most 2147483647 (integer arguments are int32-sized)", *num_splits);
  }
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
  m.set_python_module("torch_ascend_moe.meta.hc_prenorm");
  m.def("hc_prenorm_gemm(Tensor a, Tensor b, int? num_splits=None) -> (Tensor, Tensor)", {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(ascend_moe, CPU, m) { m.impl("hc_prenorm_gemm", &hc_prenorm_gemm_cpu); }

}  // namespace ascend_moe
