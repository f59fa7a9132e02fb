// Schema of the moe_gate family: DeepSeek's fused MoE gate as TileKernels computes it (specs/tilekernels_deepselect.md
// §3.3, §10.2). Its kernel is device-generic (torch_ascend_moe/backends/portable/moe_gate.py: a few [T, E]
// elementwise ops, one stable sort and gathers, with no host read but the value checks), so no C++ kernel here.
#include <torch/library.h>

namespace ascend_moe {

TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- moe_gate family: scores, group-limited top-k, weights, shared slots, redundant experts, EP/TP masks ----
  m.set_python_module("torch_ascend_moe.fakes.moe_gate");
  // -> (topk_weights [T, k + S], topk_idx int64 [T, k + S], unmapped_topk_idx int64 [T, k], scores [T, E]):
  // u = sigmoid | sqrt(softplus) | softmax | identity of logits; rank u + bias (softmax: logits + bias; image_bias on
  // image_token_mask rows) within the best num_topk_groups groups by their top-2 sum; stable top-k (or the caller's
  // unmapped_topk_idx on fix_routing_mask rows); w = u / max(sum u, 1e-20) (or sum u + 1e-20 without
  // clamp_denominator) * routed_scaling_factor; S shared slots E.. with weight 1; logical -> physical through
  // to_physical_map[e, (ep_rank + t * 23333) % logical_count[e]]; experts off this TP rank -> -1, the others
  // renumbered; rows with mask False: -1 / 0. scores = u (0 on masked rows), what the backward needs.
  m.def(
      "moe_topk_gate(Tensor logits, Tensor? bias, int num_topk, int num_groups=0, int num_topk_groups=0, "
      "str scoring_func=\"sigmoid\", float routed_scaling_factor=1., int num_shared_experts=0, Tensor? mask=None, "
      "Tensor? fix_routing_mask=None, Tensor? unmapped_topk_idx=None, Tensor? to_physical_map=None, "
      "Tensor? logical_count=None, int ep_rank=0, int num_ep_ranks=1, int tp_rank=0, int num_tp_ranks=1, "
      "Tensor? image_bias=None, Tensor? image_token_mask=None, bool clamp_denominator=True) "
      "-> (Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}

}  // namespace ascend_moe
