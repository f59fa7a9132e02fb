"""``tile_kernels.modeling.mhc.functional``: the pre step of a sublayer and the final head, as upstream composes them
(including its inference path, which skips ``norm_weight``: upstream's ``mhc_pre`` without gradients calls
``mhc_pre_big_fuse``, which takes no norm weight; ``torch_ascend_moe.ops.mhc.mhc_pre`` applies it in both)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.tile_kernels.modeling.mhc.ops import (
    expand_to_mhc,
    mhc_head_compute_mix,
    mhc_pre_apply_mix,
    mhc_pre_big_fuse,
    mhc_pre_norm_fn,
    mhc_pre_split_mixes,
    sinkhorn_normalize,
)

__all__ = ["expand_from_embedding", "mhc_head", "mhc_pre"]


def expand_from_embedding(x: torch.Tensor, mhc_mult: int = 4) -> torch.Tensor:
    return expand_to_mhc(x, mhc_mult)


def mhc_pre(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
            norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4,
            post_mult_value: float = 1.0, pre_eps: float = 1e-6, sinkhorn_eps: float = 1e-6, sinkhorn_repeat: int = 10,
            n_splits: int = 16):  # fmt: skip
    """``(layer_input, (post_mix, comb_mix))``."""
    if not torch.is_grad_enabled():
        post_mix, comb_mix, layer_input = mhc_pre_big_fuse(
            residual, fn, scale, base, rms_eps=norm_eps, mhc_pre_eps=pre_eps, mhc_sinkhorn_eps=sinkhorn_eps,
            mhc_post_mult_value=post_mult_value, sinkhorn_repeat=sinkhorn_repeat, n_splits=n_splits,
        )  # fmt: skip
        return layer_input, (post_mix, comb_mix)
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps, n_splits=n_splits)
    pre_mix, post_mix, comb_mix = mhc_pre_split_mixes(mixes, scale, base, mhc_mult, post_mult_value, pre_eps)
    comb_mix = sinkhorn_normalize(comb_mix, repeat=sinkhorn_repeat, eps=sinkhorn_eps)
    return mhc_pre_apply_mix(residual, pre_mix), (post_mix, comb_mix)


def mhc_head(residual: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
             norm_weight: torch.Tensor | None = None, norm_eps: float = 1e-6, mhc_mult: int = 4, pre_eps: float = 1e-6,
             n_splits: int = 16) -> torch.Tensor:  # fmt: skip
    """The final head's input: ``fn [m, m·H]`` padded to ``m·(m + 2)`` rows, its first ``m`` mixes."""
    rows = mhc_mult * (2 + mhc_mult)
    if fn.shape[0] < rows:
        fn = F.pad(fn, (0, 0, 0, rows - fn.shape[0]))
    mixes = mhc_pre_norm_fn(residual, fn, norm_weight, norm_eps, n_splits=n_splits)[..., :mhc_mult]
    if scale.numel() == 1:
        scale = scale.reshape(1)
    mix = mhc_head_compute_mix(mixes, scale, base, pre_eps)
    return mhc_pre_apply_mix(residual, mix.unsqueeze(-1))
