// Schema of the rope family: rotary position embedding as TileKernels' Ascend-era transform.apply_rotary computes it
// (specs/tilekernels_deepselect.md §10.5), functional (the compat function writes the result back in place). The
// kernel is device-generic (torch_ascend_moe/backends/portable/rope.py: a gather of the cache rows and four
// products per pair), so no C++ kernel here.
#include <torch/library.h>

namespace ascend_moe {

TORCH_LIBRARY_FRAGMENT(ascend_moe, m) {
  // ---- rope family: per pair (x1, x2): (x1 cos - x2 sin, x1 sin + x2 cos) ----
  m.set_python_module("torch_ascend_moe.meta.rope");
  // x [T, heads, rot] or [B, S, heads, rot] (BF16/FP32, FP64 for gradcheck); cos_sin_cache [rows, rot] FP32 (FP64
  // with FP64 x): cos in [:, :rot/2], sin in [:, rot/2:]. Row of token t: positions[t] (or [b, s]) + seqlen_offset,
  // else seqlen_offset + t (the token's index in its sequence). Pairs: NeoX halves (x[i], x[i + rot/2]), or GPT-J
  // neighbours (x[2i], x[2i+1]) with interleaved; conjugate negates sin (the inverse rotation). Computed in FP32
  // (FP64 for FP64 x), two rounded products and one add or subtract per result, rounded once to x's dtype.
  m.def(
      "rotary_embedding(Tensor x, Tensor cos_sin_cache, Tensor? positions=None, int seqlen_offset=0, "
      "bool interleaved=False, bool conjugate=False) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}

}  // namespace ascend_moe
