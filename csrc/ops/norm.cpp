// Schemas of the norm family: RMSNorm with the residual add, an output scale and the fused per-token FP8 cast, and
// its gradient, as TileKernels' Ascend-era norm_forward(_and_per_token_cast) / norm_backward compute them
// (specs/tilekernels_deepselect.md §10.4). The kernels are device-generic (torch_ascend_moe/backends/portable/norm.py:
// a row reduction and elementwise passes), so no C++ kernel here.
#include <torch/library.h>

namespace ascend_moe {

TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- norm family: s = x (+ residual, rounded to x's dtype); rstd = rsqrt(sum(s^2) / H + eps);
  // out = s * rstd * (weight * out_scale) rounded to x's dtype ----
  m.set_python_module("torch_ascend_moe.meta.norm");
  // x [..., H] BF16/FP32 (FP64 for gradcheck), weight [H] of x's dtype or None (unit). Computed in FP32 (FP64 for FP64
  // x). -> (out [..., H], rstd FP32 [...], residual_out [..., H] = s (empty without a residual)).
  m.def(
      "rms_norm(Tensor x, Tensor? weight, float eps=1e-6, Tensor? residual=None, float out_scale=1.) "
      "-> (Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // rms_norm fused with the per-token E4M3 cast of its rounded output in blocks of num_per_channels (TileKernels'
  // rule: multiplier 448 / amax, or 1 / sf with round_sf; amax floored at 1e-4): the inference path, not
  // differentiable. -> (out_fp8 [..., H], out_sf FP32 [..., ceil(H / num_per_channels)], out, rstd, residual_out).
  m.def(
      "rms_norm_quant(Tensor x, Tensor? weight, float eps=1e-6, Tensor? residual=None, float out_scale=1., "
      "int num_per_channels=32, bool round_sf=False) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // The gradient of rms_norm from its saved s (x, or the residual sum) and rstd: with x^ = s * rstd and
  // g = out_grad * out_scale, gw = g * weight: x_grad = (gw - x^ * sum(x^ * gw) / H) * rstd (+ residual_out_grad)
  // in s's dtype; weight_grad = sum over rows of x^ * g (FP32; empty without a weight).
  m.def(
      "rms_norm_backward(Tensor out_grad, Tensor x, Tensor? weight, Tensor rstd, Tensor? residual_out_grad=None, "
      "float out_scale=1.) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}

}  // namespace ascend_moe
