"""FP64 references of the model-level layers: ``moe_reference`` for ``torch_ascend_moe.nn.MoE`` (the tests and the
``demo`` compare against it).

The reference takes the layer's expert choice (``topk_idx``: near-ties between FP32 and FP64 scores could
otherwise pick different experts; the choice itself is tested op by op against ``moe_gating_topk``'s
reference in tests/moe_routing) and recomputes everything else in FP64 with plain loops: the gate's scores
and weights, every chosen expert's SwiGLU, the weighted sum, the shared experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gate_weights_fp64(gate, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """The gate's weights at the chosen experts ``idx``, in FP64."""
    logits = x.double() @ gate.weight.double().T
    scores = logits.sigmoid() if gate.score_func == "sigmoid" else logits.softmax(-1)
    w = scores.gather(1, idx)
    if gate.renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * gate.routed_scaling_factor


def swiglu_fp64(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One expert: ``gate_up [2I, H]`` (gate rows first), ``down [H, I]``."""
    gate, up = (x @ gate_up.double().T).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ down.double().T


def moe_reference(moe, x: torch.Tensor, gate_up: torch.Tensor | None = None, down: torch.Tensor | None = None):
    """``moe(x)`` in FP64 (``x [..., H]``). ``gate_up`` / ``down`` hold every expert's weights when the layer
    holds a slice of them (expert parallelism); by default the layer's own."""
    shape = x.shape
    tokens = x.detach().reshape(-1, shape[-1]).double()
    gate_up = moe.experts.gate_up_proj if gate_up is None else gate_up
    down = moe.experts.down_proj if down is None else down
    with torch.no_grad():
        idx, _, _ = moe.gate(x.detach().reshape(-1, shape[-1]))
        weights = gate_weights_fp64(moe.gate, tokens, idx)
        out = torch.zeros_like(tokens)
        for e in range(gate_up.shape[0]):
            rows, slots = (idx == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(
                    0, rows, weights[rows, slots].unsqueeze(1) * swiglu_fp64(tokens[rows], gate_up[e], down[e])
                )
        if moe.shared_experts is not None:
            s = moe.shared_experts
            hidden = F.silu(tokens @ s.gate_proj.weight.double().T) * (tokens @ s.up_proj.weight.double().T)
            out += hidden @ s.down_proj.weight.double().T
    return out.view(shape)
