// The sparse_mla family's schema: FlashMLA's sparse attention (DeepSeek Sparse Attention's consumer of the
// indexer's top-k; specs/flashmla_api.md). No C++ kernel yet: the portable one
// (torch_ascend_moe/backends/portable/sparse_mla.py, CompositeExplicitAutograd, O(s_q * topk) memory) serves every
// device, CPU included.
#include <torch/library.h>

// The family's schemas (TORCH_LIBRARY_FRAGMENT: each family defines its own ops in its own file; the
// namespace is opened in library.cpp). set_python_module names the module holding the fakes.
TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- sparse_mla family: attention of each query over its own top-k KV rows (flash_mla_sparse_fwd):
  // (out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q], natural log) ----
  m.set_python_module("torch_ascend_moe.meta.sparse_mla");
  m.def(
      "sparse_mla_prefill(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v=512, "
      "Tensor? attn_sink=None, Tensor? topk_length=None) -> (Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
}
