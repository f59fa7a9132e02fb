// Every ascend_moe schema, in one table. Kernels live in <family>_cpu.cpp (CPU) and in the Python
// backends (CUDA, NPU); fakes and autograd formulas live in the Python package named below.
#include <torch/library.h>

TORCH_LIBRARY(ascend_moe, m) {
  // Each family names the module holding its fakes (it applies to the defs that follow), so tracing
  // before the fakes are imported fails with a hint naming that module.

  // ---- gemm family: D = alpha * A @ B^T + C over logical A[M, K], B[N, K] (any majorness) ----
  m.set_python_module("torch_ascend_moe.meta.gemm");
  m.def(
      "bf16_gemm(Tensor a, Tensor b, Tensor? c=None, float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "bf16_bmm(Tensor a, Tensor b, Tensor? c=None, float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "bf16_einsum(str equation, Tensor a, Tensor b, Tensor? c=None, float alpha=1., "
      "ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // ---- fp8_gemm family: D = alpha * deq(A) @ deq(B)^T + C with block scales (FP8 E4M3 or packed FP4) ----
  // deq(X)[r, k] = X[r, k] * sf[r // gran_mn, k // gran_k]; recipes are [gran_mn, gran_k] per operand.
  // FP4 operands are uint8 [MN, K / 2], two E2M1 codes per byte (low nibble first), K-major.
  m.set_python_module("torch_ascend_moe.meta.fp8_gemm");
  m.def(
      "fp8_gemm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor? c=None, int[2] recipe_a=[1, 128], "
      "int[2] recipe_b=[128, 128], float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "fp8_bmm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor? c=None, int[2] recipe_a=[1, 128], "
      "int[2] recipe_b=[128, 128], float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Scales keep their operand's subscripts: h whole, the output letter / gran_mn, the contracted one / gran_k.
  m.def(
      "fp8_einsum(str equation, Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor? c=None, "
      "int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // ---- fp8_linear family: high-precision inputs quantized to FP8 inside the op, then fp8_gemm ----
  // Differentiable w.r.t. the high-precision inputs (straight-through estimator for the casts).
  m.set_python_module("torch_ascend_moe.meta.fp8_linear");
  // Inference: x [M, K] (BF16/FP32) cast per token in 1 x gran_k groups; b pre-quantized as in fp8_gemm.
  m.def(
      "fp8_quant_gemm(Tensor x, Tensor b, Tensor sfb, Tensor? c=None, int gran_k=128, "
      "int[2] recipe_b=[128, 128], bool use_ue8m0=False, float alpha=1., ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // Training: y = x @ weight^T + bias with x 1 x block per token and weight block x block (DeepSeek-V3);
  // fp8_backward picks FP8 (requantized gradients) or high-precision dgrad/wgrad GEMMs.
  m.def(
      "fp8_linear(Tensor x, Tensor weight, Tensor? bias=None, int block=128, bool use_ue8m0=False, "
      "bool fp8_backward=True) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // ---- grouped family: MoE grouped GEMMs over expert segments (specs/deepgemm_api.md §4-6) ----
  // layout: psum=True -> int32 [G] cumulative group ends (torch._grouped_mm's offs), group g spans rows
  // [align(end_{g-1}, alignment), end_g); psum=False -> int32 [rows] group id per row, -1 = padding.
  // Rows outside every group are zeros in the output.
  m.set_python_module("torch_ascend_moe.meta.grouped");
  // D[i] = A[i] @ B[group(i)]^T: A [M, K], B [G, N, K] (any majorness) -> D [M, N].
  m.def(
      "m_grouped_bf16_gemm(Tensor a, Tensor b, Tensor layout, bool psum=True, int alignment=1, "
      "ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // D[g, i] = A[g, i] @ B[g]^T for i < masked_m[g]; rows at or beyond masked_m[g] are zeros.
  m.def(
      "m_grouped_bf16_gemm_masked(Tensor a, Tensor b, Tensor masked_m, ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  // D[g] = C[g] + sum over rows s of group g of A[s]^T B[s]: A [S, M], B [S, N] -> D [G, M, N] (weight grads).
  m.def(
      "k_grouped_bf16_gemm(Tensor a, Tensor b, Tensor layout, int num_groups, bool psum=True, int alignment=1, "
      "Tensor? c=None, ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // Scaled variants (operands and scales as in fp8_gemm; A scales per row, recipe_a = [1, gran_k]).
  m.def(
      "m_grouped_fp8_gemm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor layout, bool psum=True, "
      "int alignment=1, int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});
  m.def(
      "m_grouped_fp8_gemm_masked(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor masked_m, "
      "int[2] recipe_a=[1, 128], int[2] recipe_b=[128, 128], ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // FP8 experts for training: BF16/FP32 x [M, K] and weight [G, N, K] cast inside (x 1 x block per token,
  // weights block x block), straight-through gradients; fp8_backward picks an FP8 or input-precision dgrad.
  m.def(
      "m_grouped_fp8_linear(Tensor x, Tensor weight, Tensor layout, bool psum=True, int alignment=1, int block=128, "
      "bool use_ue8m0=False, bool fp8_backward=True) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // FP8 weight gradients: D[g] = C[g] + deq(A)[rows_g]^T deq(B)[rows_g] over a psum layout; A [S, M] and
  // B [S, N] FP8 with per-channel scales along S, each group's ceil(k_g / gran_k) scale rows in turn.
  m.def(
      "k_grouped_fp8_gemm(Tensor a, Tensor sfa, Tensor b, Tensor sfb, Tensor layout, int num_groups, int alignment=1, "
      "int gran_k=128, Tensor? c=None, ScalarType? out_dtype=None) -> Tensor",
      {at::Tag::pt2_compliant_tag});

  // ---- moe_routing family: tokens into expert-contiguous order and back ----
  m.set_python_module("torch_ascend_moe.meta.moe_routing");
  // x [T, H], topk_idx [T, k] -> (permuted [T*k + (E-1)*(alignment-1), H], row_map int32 [T, k], offs int32 [E]).
  m.def(
      "moe_permute(Tensor x, Tensor topk_idx, int num_experts, int alignment=1) -> (Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // out[t] = sum_j topk_weights[t, j] * y[row_map[t, j]] (rows -1 skipped; weights default to 1).
  m.def("moe_unpermute(Tensor y, Tensor row_map, Tensor? topk_weights=None) -> Tensor", {at::Tag::pt2_compliant_tag});
  // Gating: scores = softmax|sigmoid(logits); top-k of scores (+ bias) within the best topk_groups of num_groups
  // groups -> (topk_weights = scores at the chosen experts, renormalized, scaled; topk_idx int64 [T, k]): torch_npu's order.
  m.def(
      "moe_gating_topk(Tensor logits, int topk, Tensor? bias=None, str score_func=\"softmax\", int num_groups=1, "
      "int topk_groups=1, bool renormalize=True, float routed_scaling_factor=1.) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});

  // ---- hc_prenorm family: mHC pre-norm GEMM (d = a @ tf32(b)^T, sqr_sum = sum_k a^2; per-split partials) ----
  m.set_python_module("torch_ascend_moe.meta.hc_prenorm");
  m.def("hc_prenorm_gemm(Tensor a, Tensor b, int? num_splits=None) -> (Tensor, Tensor)", {at::Tag::pt2_compliant_tag});

  // ---- mega_moe family: DeepGEMM's fused MegaMoE (dispatch -> L1 -> clamped SwiGLU x weight -> requant -> L2 ->
  // combine, + DeepGEMM-Ascend's fused shared experts at the token's home rank), functional: (y BF16 [T, H],
  // pairs received per local expert int32 [E_local]). Python kernel.
  m.set_python_module("torch_ascend_moe.meta.mega_moe");
  m.def(
      "mega_moe(Tensor x, Tensor? x_sf, Tensor topk_idx, Tensor topk_weights, Tensor l1_weights, Tensor? l1_sf, "
      "Tensor l2_weights, Tensor? l2_sf, Tensor? shared_l1_weights=None, Tensor? shared_l1_sf=None, "
      "Tensor? shared_l2_weights=None, Tensor? shared_l2_sf=None, str? group_name=None, "
      "float? activation_clamp=None, float timeout_s=300.) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});

  // ---- mqa_logits family: the DeepSeek sparse-attention indexer (specs/deepgemm_api.md §8) ----
  m.set_python_module("torch_ascend_moe.meta.mqa_logits");
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

  // ---- ep family: expert-parallel dispatch / combine over torch.distributed (specs/deepep_api.md §3-§5) ----
  // Kernels are device-generic Python (torch.distributed moves the data); `group_name` names the process group.
  m.set_python_module("torch_ascend_moe.meta.ep");
  // (num_tokens_per_rank [R], num_tokens_per_node [max(1, R / ranks_per_node)], num_tokens_per_expert [E],
  //  is_token_in_rank [T, R]): DeepEP's get_dispatch_layout, purely local.
  m.def(
      "ep_dispatch_layout(Tensor topk_idx, int num_experts, int num_ranks, int ranks_per_node=8) "
      "-> (Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // One row per (token, destination rank), received source-rank-major then by ascending source token.
  // Returns (recv_x, recv_x_scales, recv_topk_idx, recv_topk_weights, num_recv_tokens_per_expert, num_recv,
  // and the handle: send_src, send_counts, recv_counts, recv_gather). num_worst_tokens > 0: that many rows
  // (static shapes, padding rows zero / -1); 0: exactly the received rows (a data-dependent size).
  m.def(
      "ep_dispatch(Tensor x, Tensor? x_scales, Tensor topk_idx, Tensor? topk_weights, int num_experts, "
      "str group_name, int expert_alignment=1, int num_worst_tokens=0, float timeout_s=300.0) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // Replays a dispatch's routing (its handle) with new rows: (recv_x, recv_x_scales).
  m.def(
      "ep_dispatch_cached(Tensor x, Tensor? x_scales, Tensor send_src, Tensor send_counts, Tensor recv_counts, "
      "Tensor recv_gather, str group_name, float timeout_s=300.0) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // combined[t] = round(bias_0[t] + bias_1[t] + sum over the ranks t went to, ascending, of x_r[row of t]) in FP32;
  // unweighted, as DeepEP's normal combine. Returns (combined_x [T, H], combined_topk_weights [T, K]).
  m.def(
      "ep_combine(Tensor x, Tensor? topk_weights, Tensor? bias_0, Tensor? bias_1, Tensor send_src, "
      "Tensor send_counts, Tensor recv_counts, Tensor recv_gather, int num_tokens, str group_name, "
      "float timeout_s=300.0) -> (Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // Low-latency mode: one message per (token, valid slot) into fixed [L, R * T_max, H] per-local-expert buffers,
  // rows [0, recv_count[i]) valid, source-rank-major then ascending token. Optional FP8 cast per 128 channels
  // (DeepEP's: round_scale = power-of-two scales, use_ue8m0 = their exponent bytes packed 4 per int32);
  // slot_weights scales each (token, slot) message (the combine's backward). Returns (recv_x, recv_x_scales,
  // recv_count [L], src_info [L, R * T_max], layout_range [L, R]: (begin << 32) | count per source).
  m.def(
      "ep_low_latency_dispatch(Tensor x, Tensor topk_idx, int num_max_dispatch_tokens_per_rank, int num_experts, "
      "str group_name, bool use_fp8=True, bool round_scale=False, bool use_ue8m0=False, Tensor? slot_weights=None, "
      "float timeout_s=300.0) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
      {at::Tag::pt2_compliant_tag});
  // combined[t] = round(sum over valid slots k, in order, of topk_weights[t, k] * y_k(t)) in FP32: weighted.
  m.def(
      "ep_low_latency_combine(Tensor x, Tensor topk_idx, Tensor topk_weights, Tensor src_info, Tensor layout_range, "
      "int num_max_dispatch_tokens_per_rank, str group_name, float timeout_s=300.0) -> Tensor",
      {at::Tag::pt2_compliant_tag});
}
