"""``tile_kernels.testing.bench``: the parameter ids and dtype names upstream's tests use (its timers are CUDA's; on
this package ``python -m torch_ascend_moe bench`` measures)."""

from __future__ import annotations

import torch

_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float8_e4m3fn: "e4m3", torch.int8: "e2m1"}


def dtype_to_str(dtype: torch.dtype) -> str:
    if dtype not in _NAMES:
        raise ValueError(f"Unsupported dtype: {dtype}. Only fp32, bf16, e4m3, and int8(e2m1) are supported")
    return _NAMES[dtype]


def _format(value) -> str:
    if isinstance(value, torch.dtype):
        return dtype_to_str(value)
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    return str(value)


def make_param_id(params: dict) -> str:
    return "-".join(f"{k}={_format(v)}" for k, v in params.items()) or "default"
