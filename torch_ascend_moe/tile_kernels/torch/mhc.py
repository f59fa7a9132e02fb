"""``tile_kernels.torch.mhc``: upstream's mHC reference names over ``torch_ascend_moe.ops.mhc`` (the same
computations as ``tile_kernels.modeling.mhc.ops``; our tests judge them against the spec's formulas)."""

from __future__ import annotations

import torch

from torch_ascend_moe.ops import mhc

__all__ = [
    "expand_to_mhc_ref",
    "mhc_head_compute_mix_ref",
    "mhc_post_ref",
    "mhc_pre_apply_mix_ref",
    "mhc_pre_norm_fn_ref",
    "mhc_pre_split_mixes_ref",
    "sinkhorn_normalize_ref",
]


def expand_to_mhc_ref(hidden: torch.Tensor, mhc_mult: int) -> torch.Tensor:
    return mhc.expand_to_mhc(hidden, mhc_mult)


def sinkhorn_normalize_ref(x: torch.Tensor, repeat: int = 10, eps: float = 1e-6) -> torch.Tensor:
    return mhc.sinkhorn_normalize(x, repeat, eps)


def mhc_head_compute_mix_ref(input_mix, mhc_scale, mhc_base, mhc_pre_eps: float) -> torch.Tensor:
    return mhc.mhc_head_compute_mix(input_mix, mhc_scale, mhc_base, mhc_pre_eps)


def mhc_pre_split_mixes_ref(input_mixes, mhc_scale, mhc_base, mhc_mult: int, mhc_post_mult_value: float,
                            mhc_pre_eps: float):  # fmt: skip
    return mhc.mhc_pre_split_mixes(input_mixes, mhc_scale, mhc_base, mhc_mult, mhc_post_mult_value, mhc_pre_eps)


def mhc_pre_apply_mix_ref(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    return mhc.mhc_pre_apply_mix(x, mix)


def mhc_post_ref(x, residual, post_layer_mix, comb_res_mix) -> torch.Tensor:
    return mhc.mhc_post(x, residual, post_layer_mix, comb_res_mix)


def mhc_pre_norm_fn_ref(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps: float) -> torch.Tensor:
    return mhc.mhc_pre_norm_fn(residual, mhc_fn, mhc_norm_weight, mhc_norm_eps)
