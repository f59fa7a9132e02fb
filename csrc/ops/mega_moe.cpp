// The mega_moe family's schema. It has no C++ kernel: the portable one
// (torch_ascend_moe/backends/portable/mega_moe.py, CompositeExplicitAutograd) serves every device, CPU included;
// mega_moe_cpu.cpp holds the C++ its eager CPU path calls: steps 2-7 of a single-process BF16 call without
// autograd in one call, and, for a recorded call, the SwiGLU step and that step's backward.
#include <torch/library.h>

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- mega_moe family: DeepGEMM's fused MegaMoE (dispatch -> L1 -> clamped SwiGLU x weight -> requant -> L2 ->
  // combine, + DeepGEMM-Ascend's fused shared experts at the token's home rank), functional: (y BF16 [T, H],
  // pairs received per local expert int32 [E_local]). Python kernel.
  m.set_python_module("torch_ascend_moe.fakes.mega_moe");
  m.def(
      "mega_moe(Tensor x, Tensor? x_sf, Tensor topk_idx, Tensor topk_weights, Tensor l1_weights, Tensor? l1_sf, "
      "Tensor l2_weights, Tensor? l2_sf, Tensor? shared_l1_weights=None, Tensor? shared_l1_sf=None, "
      "Tensor? shared_l2_weights=None, Tensor? shared_l2_sf=None, str? group_name=None, "
      "float? activation_clamp=None, float timeout_s=300.) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}
