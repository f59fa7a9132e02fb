"""``tile_kernels.torch``: upstream's PyTorch-reference names, bound to the same implementations as the kernels'
names (there is one implementation here; our tests judge it against references written from the spec).

``swiglu_forward`` / ``swiglu_backward`` take either reference API (v1's ``pos_to_token_topk`` maps and
QuantTensor backward, or the Ascend era's psum layout): see ``tile_kernels.quant.swiglu``.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.portable.swiglu import layout_rows
from torch_ascend_moe.ops.moe_gate import (
    aux_fi,
    group_count,
    mask_indices_by_tp,
    normalize_weight,
    topk_sum_and_topk_group_idx,
)
from torch_ascend_moe.ops.moe_gate import topk_gate as stable_topk
from torch_ascend_moe.ops.norm import rms_norm, rms_norm_backward
from torch_ascend_moe.ops.rope import rotary_embedding
from torch_ascend_moe.ops.swiglu import swiglu_backward as _backward
from torch_ascend_moe.ops.swiglu import swiglu_forward as _forward
from torch_ascend_moe.tile_kernels.config import get_token_alignment
from torch_ascend_moe.tile_kernels.moe import (
    inplace_unique_group_indices,
    moe_topk_gate_backward,
    moe_topk_gate_forward,
    top2_sum_gate,
)
from torch_ascend_moe.tile_kernels.moe.fused import expand_to_fused, expand_to_fused_with_sf, reduce_fused
from torch_ascend_moe.tile_kernels.quant import _cast
from torch_ascend_moe.tile_kernels.quant import cast_back as _cast_back
from torch_ascend_moe.tile_kernels.quant.swiglu import ascend_era, bind, scatter_weight_grad, weights_per_row
from torch_ascend_moe.tile_kernels.torch import engram, mhc  # noqa: F401  (upstream's submodules)
from torch_ascend_moe.tile_kernels.torch.per_channel_cast_fused import per_channel_cast_fused

__all__ = [
    "aux_fi",
    "cast",
    "cast_back",
    "cast_back_from_e5m6",
    "cast_to_e5m6",
    "expand_to_fused",
    "expand_to_fused_with_sf",
    "get_mapping_from_psum",
    "group_count",
    "inplace_unique_group_indices",
    "mask_indices_by_tp",
    "moe_topk_gate_backward",
    "moe_topk_gate_forward",
    "norm_backward_ref",
    "norm_forward_ref",
    "normalize_weight",
    "per_channel_cast_fused",
    "reduce_fused",
    "rotary_embedding_ref",
    "stable_topk",
    "swiglu_backward",
    "swiglu_forward",
    "top2_sum_gate",
    "topk_sum_and_topk_group_idx",
]


def cast(x, fmt: str, block_size=(32, 32), sf: torch.Tensor | None = None, x_block_size=None, round_sf: bool = False,
         use_tma_aligned_col_major_sf: bool = False, use_packed_ue8m0: bool = False):  # fmt: skip
    """``(data, sf)`` of ``x`` (or a QuantTensor) cast in ``block_size`` blocks; the data alone with a given ``sf``."""
    if sf is not None:
        return _cast(x, fmt, tuple(block_size), x_block_size, False, False, False, sf=sf.float().contiguous())[0]
    return _cast(x, fmt, tuple(block_size), x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def cast_back(x, fmt: str, block_size=(32, 32)) -> torch.Tensor:
    return _cast_back(x, fmt, tuple(block_size))


def cast_to_e5m6(x, num_per_channels: int, use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                 use_packed_ue8m0: bool = False):  # fmt: skip
    """``(packed uint8 [T, 3H / 2], sf)``: the per-token E5M6 cast."""
    assert x.ndim == 2 and x.dtype in (torch.float32, torch.bfloat16)
    assert x.shape[1] % num_per_channels == 0 and x.shape[1] % 8 == 0
    return _cast(x, "e5m6", (1, num_per_channels), None, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def cast_back_from_e5m6(x, fmt: str, x_block_size) -> torch.Tensor:
    return _cast_back(x, fmt, tuple(x_block_size), "e5m6")


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


def norm_forward_ref(x, weight, eps: float, residual=None, out_scale: float = 1.0):
    """``(out, rstd, residual_out)``: RMSNorm of ``x (+ residual)``; ``residual_out`` is x itself without one."""
    out, rstd, s = rms_norm(x, weight, eps, residual=residual, out_scale=out_scale)
    return out, rstd, x if residual is None else s


def norm_backward_ref(out_grad, x, weight, rstd, residual_out_grad=None, out_scale: float = 1.0):
    """``(x_grad, weight_grad)``: ``weight_grad`` in FP32 (None without a weight)."""
    x_grad, w_grad = rms_norm_backward(out_grad, x, weight, rstd, residual_out_grad=residual_out_grad,
                                       out_scale=out_scale)  # fmt: skip
    return x_grad, (w_grad if weight is not None else None)


def rotary_embedding_ref(x, cos, sin, positions=None, seqlen_offsets: int = 0, interleaved: bool = False,
                         conjugate: bool = False):  # fmt: skip
    """``x [..., tokens, heads, D]`` with its first ``2 · cos.size(-1)`` channels rotated by ``cos`` / ``sin``
    ``[rows, rot/2]`` (the rest copied), out of place."""
    rot = 2 * cos.shape[-1]
    out = x.clone()
    cache = torch.cat([cos, sin], dim=-1).float()
    out[..., :rot] = rotary_embedding(
        x[..., :rot].contiguous(), cache, positions, seqlen_offset=seqlen_offsets, interleaved=interleaved,
        conjugate=conjugate,
    )  # fmt: skip
    return out
