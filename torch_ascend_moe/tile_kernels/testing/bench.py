"""``tile_kernels.testing.bench``: the parameter ids and dtype names upstream's tests use (its timers are CUDA's; on
this package ``python -m torch_ascend_moe bench`` measures)."""

from __future__ import annotations

import torch

from torch_ascend_moe.tile_kernels.utils import dtype_to_str


def _format(value) -> str:
    if isinstance(value, torch.dtype):
        return dtype_to_str(value)
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    return str(value)


def make_param_id(params: dict) -> str:
    return "-".join(f"{k}={_format(v)}" for k, v in params.items()) or "default"


# Upstream's short names and widths of a benchmark record's key (its benchmark plugin, loaded by its tests' conftest,
# imports make_param_key).
_SHORT_NAME = {"num_ep_ranks": "ep", "num_experts": "experts", "use_tma_aligned_col_major_sf": "col",
               "use_packed_ue8m0": "ue8m0", "round_sf": "round"}  # fmt: skip
_WIDTH = {"num_tokens": 5, "num_ep_ranks": 2, "num_experts": 3, "hidden": 4, "use_tma_aligned_col_major_sf": 1,
          "use_packed_ue8m0": 1, "round_sf": 1, "num_per_channels": 4}  # fmt: skip


def make_param_key(params: dict) -> str:
    """A benchmark record's key: ``name=value`` pairs (short names, values right-aligned to upstream's widths),
    comma-separated, None values left out."""
    return ",".join(
        f"{_SHORT_NAME.get(k, k)}={format(v, f'>{_WIDTH[k]}') if k in _WIDTH else v}"
        for k, v in params.items()
        if v is not None
    )


def get_cast_params(params: dict) -> dict:
    """The Ascend era's: a test case's scale-layout options (``round_sf``, ``use_packed_ue8m0``,
    ``use_tma_aligned_col_major_sf``), as keywords for a cast."""
    return {k: params[k] for k in ("round_sf", "use_packed_ue8m0", "use_tma_aligned_col_major_sf") if k in params}
