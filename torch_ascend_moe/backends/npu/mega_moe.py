"""``mega_moe`` on Ascend: no single-op adapter; the portable kernel is the best composition torch_npu 2.13 allows
exactly. It runs its steps through the dispatcher (``backends/portable/mega_moe.py``), so on an NPU each step is
its own Ascend adapter where one maps, bitwise the op's rounding points: ``moe_permute`` ->
``npu_moe_init_routing_v2``, the BF16 L1/L2 grouped GEMMs -> ``npu_grouped_matmul``, the combine ->
``npu_moe_finalize_routing`` (FP32 rows) or the portable sum, the dense shared-expert GEMMs -> ACLNN matmul.
Why not the fused ops the issue names:

* ``npu_grouped_matmul_swiglu_quant`` (A2/A3) and ``_v2``: INT8 x INT8 (or INT4) with per-channel weight and
  per-token activation scales, INT8 output with a per-row FP32 scale. Ours is BF16 x BF16 or FP8 x FP4 with
  1 x 32 UE8M0 block scales, multiplies the router weight before the requant, clamps gate/up first, and requants
  to E4M3 with 1 x 32 power-of-two scales: no dtype, scale layout or rounding point in common.
* ``npu_moe_distribute_dispatch_v2`` / ``combine_v2`` (MC2) for the expert-parallel form: their rows are per
  (token, expert) in MC2's own order with opaque assist state, while ``mega_moe`` dispatches with ``ep_dispatch``
  (per-token rows, our order) and combines each rank's FP32 partial sum with one rounding at home; the MC2
  mapping exists as functions for the compiler pass (``backends/npu/ep.py``), not inside this op.
* The FP8 x FP4 L1/L2 GEMMs stay on the portable ``m_grouped_fp8_gemm`` (FP4 operands have no MX mapping:
  ``backends/npu/grouped.py`` says why); FP8 x FP8 ones with power-of-two scales take its MX adapter on Ascend 950.
* The NPU ``mega_moe`` of vllm-ascend's ``_C_ascend`` extension (``torch.ops._C_ascend.npu_mega_moe`` with a
  ``SymmBuffer`` from ``CommContextManager``; specs/upstream_2609.md §10): not in the torch_npu 2.13.0 wheel, and
  its math (SwiGLU order, clamp, requantisation) is not published, so no adapter could be checked to compute ours.
"""

from torch_ascend_moe.backends.chain import stays_portable

stays_portable(
    "mega_moe",
    device="npu",
    why="no single-op adapter: its portable steps reach their own Ascend adapters (routing, grouped matmul, finalize)",
)
