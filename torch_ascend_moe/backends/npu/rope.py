"""The rope family on Ascend: ``rotary_embedding`` runs its portable kernel (a gather and elementwise ACLNN ops).

Not mapped yet, and why: torch_npu 2.13's ``npu_rotary_mul(x, r1, r2, rotary_mode)`` takes full-width cos/sin
tensors broadcast against x (``half`` / ``interleave`` modes) rather than a cache and positions, and
``npu_apply_rotary_pos_emb`` rotates q and k in place with its own layout (BSND) restrictions; both would need the
cache rows expanded first and their rounding (one fused multiply-add or two products?) is not documented.
"""

from torch_ascend_moe.backends.chain import stays_portable

stays_portable(
    "rotary_embedding",
    device="npu",
    why="npu_rotary_mul takes full-width cos/sin, not a cache and positions; its rounding is undocumented",
)
