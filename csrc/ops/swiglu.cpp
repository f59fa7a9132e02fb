// Schemas of the swiglu family: the experts' activation between the two grouped GEMMs as TileKernels computes it
// (specs/tilekernels_deepselect.md §6, §10.6): SwiGLU with the clamp and its counters, a routing weight per expanded
// row, DeepGEMM's psum layout, and the per-token FP8 cast of the result (forward) or of the input gradient
// (backward). The kernel is device-generic (torch_ascend_moe/backends/portable/swiglu.py: elementwise passes and
// quantize_blocks' cast; no host read but the layout value check), so no C++ kernel here.
#include <torch/library.h>

namespace ascend_moe {

TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- swiglu family: clamp (counted) -> silu(a) * b -> x routing weight -> FP32 / BF16 / per-token E4M3 ----
  m.set_python_module("torch_ascend_moe.meta.swiglu");
  // x [N, 2H] = [a | b]. a = min(a, c), b = clamp(b, -c, c) when clamp_value c is given; y = a / (1 + exp(-a)) * b
  // in FP32 (FP64 for FP64 x); y *= topk_weights[n] * routed_scaling_factor. Rows outside the psum layout
  // (expert e owns [align(psum[e-1], alignment), psum[e])) are 0. out_dtype None: the compute dtype (FP32, FP64
  // for FP64 x); float8_e4m3fn: y cast per row in blocks of num_per_channels (TileKernels' rule: multiplier
  // 448 / amax, or 1 / sf with round_sf; amax floored at sf_clamp_min, default 1e-4), sf FP32
  // [N, ceil(H / num_per_channels)]; other dtypes: sf empty.
  // -> (out [N, H], sf, clamped_count int64 [4]: #(a > c), #(b > c), #(b < -c), valid rows * H).
  m.def(
      "swiglu_forward(Tensor x, Tensor? topk_weights=None, Tensor? psum_num_tokens_per_expert=None, "
      "int alignment=128, float? routed_scaling_factor=None, float? clamp_value=None, "
      "ScalarType? out_dtype=None, int num_per_channels=128, bool round_sf=False, float? sf_clamp_min=None) "
      "-> (Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // The gradient of swiglu_forward (TileKernels' swiglu_backward(_and_per_token_cast)): x [N, 2H] (or E4M3 with
  // FP32 per-row block scales x_sf [N, 2H / block]) and grad_out [N, H]. With w = topk_weights * scale (0 off
  // the layout) and s = 1 / (1 + exp(-a)) on the clamped halves: g = grad_out * w * s, da = g * b * fma(a, 1 - s,
  // 1), db = g * a, zero where the clamp held; out = a / (1 + exp(-a)) * b * w (the recomputed forward);
  // weight_grad[n] = sum_h grad_out * a / (1 + exp(-a)) * b, times scale, 0 off the layout.
  // -> (x_grad [N, 2H] in out_dtype (grad_out's by default), x_grad's per-token E4M3 cast in blocks of
  // num_per_channels and its FP32 sf when num_per_channels > 0 (empty otherwise; cast from the FP32 gradient),
  // weight_grad [N] (empty without weights), out [N, H] in out_dtype).
  m.def(
      "swiglu_backward(Tensor x, Tensor? x_sf, Tensor grad_out, Tensor? topk_weights=None, "
      "Tensor? psum_num_tokens_per_expert=None, int alignment=128, float? routed_scaling_factor=None, "
      "float? clamp_value=None, ScalarType? out_dtype=None, int num_per_channels=0, bool round_sf=False) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}

}  // namespace ascend_moe
