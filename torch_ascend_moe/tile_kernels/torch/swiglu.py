"""``tile_kernels.torch.swiglu``: upstream's reference ``swiglu_forward`` / ``swiglu_backward``, taking either
reference API (v1's ``pos_to_token_topk`` maps and QuantTensor backward, or the Ascend era's psum layout): see
``tile_kernels.quant.swiglu``."""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.portable.swiglu import layout_rows
from torch_ascend_moe.ops.swiglu import swiglu_backward as _backward
from torch_ascend_moe.ops.swiglu import swiglu_forward as _forward
from torch_ascend_moe.tile_kernels.config import get_token_alignment
from torch_ascend_moe.tile_kernels.quant.swiglu import ascend_era, bind, scatter_weight_grad, weights_per_row

__all__ = ["elementwise_fma", "get_mapping_from_psum", "swiglu_backward", "swiglu_forward"]


def elementwise_fma(a: torch.Tensor, b, c):
    """``a * b + c`` (upstream's helper; its own is compiled to a fused multiply-add)."""
    return a * b + c


def swiglu_forward(x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    """The FP32 SwiGLU output: v1 ``(x, pos_to_token_topk, topk_weights [T, k], swiglu_clamp_value, clamped_count
    [3])``, or the Ascend era's ``(x, psum_num_tokens_per_expert, topk_weights [N], routed_scaling_factor,
    clamp_value, clamped_count [4])`` (whose padding rows are computed; the layout only limits the counts)."""
    weights = args[1] if len(args) > 1 else kwargs.get("topk_weights")
    layout = args[0] if args else kwargs.get("psum_num_tokens_per_expert", kwargs.get("pos_to_token_topk"))
    if ascend_era(kwargs, weights, layout):
        names = ("psum_num_tokens_per_expert", "topk_weights", "routed_scaling_factor", "clamp_value", "clamped_count")
        a = bind(names, {}, args, kwargs)
        psum, clamp, count = a.get("psum_num_tokens_per_expert"), a.get("clamp_value"), a.get("clamped_count")
        out, _, counts = _forward(x, a.get("topk_weights"), routed_scaling_factor=a.get("routed_scaling_factor"),
                                  clamp_value=clamp)  # fmt: skip
        if count is not None and clamp is not None:
            if psum is not None:
                counts = _forward(x, psum_num_tokens_per_expert=psum, alignment=get_token_alignment(),
                                  clamp_value=clamp)[2]  # fmt: skip
            count += counts.to(count)
        return out
    names = ("pos_to_token_topk", "topk_weights", "swiglu_clamp_value", "clamped_count")
    a = bind(names, {}, args, kwargs)
    clamp, count = a.get("swiglu_clamp_value"), a.get("clamped_count")
    out, _, counts = _forward(x, weights_per_row(a.get("pos_to_token_topk"), a.get("topk_weights")), clamp_value=clamp)
    if count is not None and clamp is not None:
        count += counts[:3].to(count)
    return out


def swiglu_backward(x, grad_out: torch.Tensor, *args, **kwargs):
    """v1 ``((x_fp8, x_sf), grad_out, weight [T, k], pos_to_token_topk, token_topk_to_pos, num_per_channels,
    swiglu_clamp_value) -> (out, x_grad, weight_grad [T, k])``, or the Ascend era's ``(x, grad_out,
    psum_num_tokens_per_expert, topk_weights [N], routed_scaling_factor, clamp_value, alignment) -> (x_grad,
    weight_grad, out)`` (``(x_grad, out)`` without weights); every result FP32."""
    if isinstance(x, tuple):
        names = ("weight", "pos_to_token_topk", "token_topk_to_pos", "num_per_channels", "swiglu_clamp_value")
        a = bind(names, {}, args, kwargs)
        data, x_sf = x
        npc = a["num_per_channels"]
        assert npc in (32, 128) and data.size(-1) % (2 * npc) == 0
        hidden = data.size(-1) // 2
        p2tt, weight = a["pos_to_token_topk"], a["weight"]
        x_grad, _, _, w_grad, out = _backward(
            data.view(-1, 2 * hidden), grad_out.view(-1, hidden), weights_per_row(p2tt, weight), x_sf=x_sf,
            clamp_value=a.get("swiglu_clamp_value"), out_dtype=torch.float32,
        )  # fmt: skip
        return out, x_grad, scatter_weight_grad(w_grad, p2tt, weight)
    names = ("psum_num_tokens_per_expert", "topk_weights", "routed_scaling_factor", "clamp_value", "alignment")
    a = bind(names, {}, args, kwargs)
    weights, psum = a.get("topk_weights"), a.get("psum_num_tokens_per_expert")
    if psum is not None:
        assert a.get("alignment") is not None, "alignment is required when psum_num_tokens_per_expert is provided"
    hidden = x.size(-1) // 2
    # Without weights the layout changes nothing upstream (its padding rows are computed): it is not passed.
    x_grad, _, _, w_grad, out = _backward(
        x.view(-1, 2 * hidden), grad_out.view(-1, hidden), weights, psum if weights is not None else None,
        alignment=a.get("alignment") or 1, routed_scaling_factor=a.get("routed_scaling_factor"),
        clamp_value=a.get("clamp_value"), out_dtype=torch.float32,
    )  # fmt: skip
    return (x_grad, w_grad, out) if weights is not None else (x_grad, out)


def get_mapping_from_psum(x: torch.Tensor, psum_num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
    """Bool ``[N]``: the rows of ``x`` some expert owns in the psum layout (the token alignment of ``config``)."""
    return layout_rows(psum_num_tokens_per_expert, get_token_alignment(), x.shape[0], x.device)
