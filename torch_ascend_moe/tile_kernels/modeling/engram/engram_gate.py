"""``tile_kernels.modeling.engram.engram_gate``: ``output = hidden_states + sigmoid(signed_sqrt(dot(RMSNorm(x, wh),
RMSNorm(k, we)) / √H)) · v`` with ``hidden_states`` / ``k`` ``[*, hc, H]``, ``v [*, H]``, weights ``[hc, H]``."""

from __future__ import annotations

import torch

from torch_ascend_moe.tile_kernels.engram import engram_gate_bwd, engram_gate_fwd, fused_weight, grad_w_reduce

__all__ = ["EngramGateFn", "engram_gate"]


class EngramGateFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_states, k, v, weight_hidden, weight_embed, clamp_value, eps):
        shape = hidden_states.shape
        hc, hidden = shape[-2:]
        x, k, v = hidden_states.reshape(-1, hc, hidden), k.reshape(-1, hc, hidden), v.reshape(-1, hidden)
        fused = fused_weight(weight_hidden, weight_embed)
        out, dot, gate, rstd_x, rstd_k = engram_gate_fwd(x, k, v, fused, eps, clamp_value)
        ctx.save_for_backward(x, k, v, weight_hidden, weight_embed, fused, dot, gate, rstd_x, rstd_k)
        ctx.clamp_value, ctx.shape = clamp_value, shape
        return out.view(shape)

    @staticmethod
    def backward(ctx, grad_output):
        x, k, v, wh, we, fused, dot, gate, rstd_x, rstd_k = ctx.saved_tensors
        shape = ctx.shape
        hc, hidden = shape[-2:]
        gx, gk, gv, partial = engram_gate_bwd(
            grad_output.reshape(-1, hc, hidden), x, k, v, fused, dot, gate, rstd_x, rstd_k, ctx.clamp_value
        )
        main_wh, main_we = getattr(wh, "main_grad", None), getattr(we, "main_grad", None)
        grad_wh = main_wh if main_wh is not None else torch.zeros_like(wh, dtype=torch.float32)
        grad_we = main_we if main_we is not None else torch.zeros_like(we, dtype=torch.float32)
        grad_w_reduce(partial, wh, we, grad_wh, grad_we)
        return (
            gx.view(shape), gk.view(shape), gv.view(*shape[:-2], hidden),
            None if main_wh is not None else grad_wh, None if main_we is not None else grad_we, None, None,
        )  # fmt: skip


engram_gate = EngramGateFn.apply
