"""The moe_gate family on Ascend: ``moe_topk_gate`` runs its portable kernel (a few elementwise ops over ``[T, E]``,
one stable sort, gathers: ACLNN ops on an NPU, no host read while capturing).

Not mapped yet: torch_npu 2.13's ``npu_moe_gating_top_k`` (which ``moe_gating_topk`` uses) computes only the
sigmoid/softmax group-limited part of this gate; the sqrt-softplus scores, TileKernels' softmax ranking on
``logits + bias``, shared experts as weight-1 slots, fixed routing, the redundant-expert hash and the EP/TP renumbering
would all stay around it, and its tie order is not documented. TileKernels' own Ascend gate kernels
(``moe_topk_gate_forward`` in TileLang-Ascend) are not a torch op we could call.
"""

from torch_ascend_moe.backends.chain import stays_portable

stays_portable(
    "moe_topk_gate",
    device="npu",
    why="npu_moe_gating_top_k computes only the group-limited sigmoid/softmax part, ties undocumented",
)
