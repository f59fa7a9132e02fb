"""``tile_kernels.torch``: upstream's PyTorch-reference names, bound to the same implementations as the kernels'
names (there is one implementation here; our tests judge it against references written from the spec), in
upstream's submodules (``torch.cast``, ``torch.topk``, ``torch.swiglu``, ...); the Ascend era's references
(``norm_*_ref``, ``rotary_embedding_ref``, ``get_mapping_from_psum``, ``moe_topk_gate_*``) here."""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.portable.swiglu import layout_rows
from torch_ascend_moe.ops.norm import rms_norm, rms_norm_backward
from torch_ascend_moe.ops.rope import rotary_embedding
from torch_ascend_moe.tile_kernels.config import get_token_alignment
from torch_ascend_moe.tile_kernels.moe import moe_topk_gate_backward, moe_topk_gate_forward

# Upstream's layout: one submodule per reference, its names bound here. Relative, and after each submodule's import,
# as upstream's: a copy of this package imported under upstream's name (``sys.modules["tile_kernels"] = ...``) then
# loads its own submodules at init and binds ``cast`` / ``reduce_fused`` / ... to the functions; imported later, a
# submodule would replace the function of its name on the package.
from . import engram, mhc  # noqa: F401
from .cast import cast, cast_back
from .cast_e5m6 import cast_back_from_e5m6, cast_to_e5m6
from .expand_to_fused import expand_to_fused, expand_to_fused_with_sf
from .mhc import (
    expand_to_mhc_ref,
    mhc_head_compute_mix_ref,
    mhc_post_ref,
    mhc_pre_apply_mix_ref,
    mhc_pre_norm_fn_ref,
    mhc_pre_split_mixes_ref,
    sinkhorn_normalize_ref,
)
from .moe import aux_fi, group_count, inplace_unique_group_indices, mask_indices_by_tp, normalize_weight
from .per_channel_cast_fused import per_channel_cast_fused
from .reduce_fused import reduce_fused
from .swiglu import swiglu_backward, swiglu_forward
from .topk import stable_topk, top2_sum_gate, topk_sum_and_topk_group_idx

__all__ = [
    "aux_fi",
    "expand_to_mhc_ref",
    "mhc_head_compute_mix_ref",
    "mhc_post_ref",
    "mhc_pre_apply_mix_ref",
    "mhc_pre_norm_fn_ref",
    "mhc_pre_split_mixes_ref",
    "sinkhorn_normalize_ref",
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
