"""Benchmark cases of the mega_moe family: ``python -m torch_ascend_moe bench mega_moe``.

The fused op against the unfused pipeline of our separate ops a user would write (``moe_permute`` →
``m_grouped_bf16_gemm`` (L1) → clamped ``silu(gate) · up · w`` in FP32 → BF16 → ``m_grouped_bf16_gemm`` (L2) →
``moe_unpermute``), BF16 mode, one process, the same inputs in the same run. Issue 21's goal: ≥ 1.3×.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.grouped import m_grouped_bf16_gemm
from torch_ascend_moe.ops.mega_moe import mega_moe
from torch_ascend_moe.ops.moe_routing import moe_permute, moe_unpermute

CLAMP = 10.0


def unfused(x, idx, weights, l1, l2):
    """The BF16 pipeline step by step (the L1 output ``[pairs, 2I]`` in memory, the SwiGLU in torch ops)."""
    permuted, row_map, offs = moe_permute(x, idx, l1.shape[0])
    spare = torch.where(row_map >= 0, row_map.long(), permuted.shape[0]).view(-1)
    row_w = torch.zeros(permuted.shape[0] + 1).index_copy(0, spare, weights.float().reshape(-1))[:-1]
    gate, up = m_grouped_bf16_gemm(permuted, l1, offs).chunk(2, dim=-1)
    act = F.silu(gate.clamp(max=CLAMP).float()) * up.clamp(-CLAMP, CLAMP).float() * row_w.unsqueeze(1)
    return moe_unpermute(m_grouped_bf16_gemm(act.bfloat16(), l2, offs), row_map)


def _case(tokens: int, hidden: int, inter: int, experts: int, topk: int) -> Case:
    def setup():
        g = torch.Generator().manual_seed(0)
        x = torch.randn(tokens, hidden, generator=g).bfloat16()
        idx = torch.rand(tokens, experts, generator=g).topk(topk, dim=1).indices
        w = torch.rand(tokens, topk, generator=g)
        l1 = (torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5).bfloat16()
        l2 = (torch.randn(experts, hidden, inter, generator=g) * inter**-0.5).bfloat16()

        def ours():
            with torch.no_grad():
                return mega_moe(x, idx, w, l1, l2, activation_clamp=CLAMP)[0]

        def baseline():
            with torch.no_grad():
                return unfused(x, idx, w, l1, l2)

        return ours, baseline

    flops = tokens * topk * 6 * hidden * inter
    return Case(
        f"mega_moe BF16 T{tokens} H{hidden} I{inter} top-{topk} of {experts}",
        flops,
        setup,
        "unfused pipeline of our ops",
    )


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [_case(32, 128, 64, 4, 2)]
    return [_case(1024, 2048, 1024, 16, 4), _case(64, 2048, 1024, 16, 4)]
