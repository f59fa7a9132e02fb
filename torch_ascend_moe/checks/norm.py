"""The norm family's argument checks (``rms_norm``, ``rms_norm_quant``, ``rms_norm_backward``). Twin:
``csrc/ops/norm_checks.h`` (the same checks in the same order, the same words; tests/test_validation_twins.py
compares them)."""

from __future__ import annotations

import math

import torch

from torch_ascend_moe import checks as ck

FORWARD = "ascend_moe::rms_norm"
QUANT = "ascend_moe::rms_norm_quant"
BACKWARD = "ascend_moe::rms_norm_backward"
DTYPES = (torch.bfloat16, torch.float32, torch.float64)
DTYPES_TEXT = "torch.bfloat16, torch.float32 or torch.float64"


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def check_like_x(op: str, name: str, t, x) -> None:
    """``t`` has x's shape, dtype and device."""
    if t is None:
        return
    ck.check_arg(t.dtype == x.dtype, op, name, "dtype", lambda: f"{x.dtype} (same as 'x')", t.dtype)
    ck.check_arg(t.device == x.device, op, name, "device", lambda: f"{x.device} (same as 'x')", t.device)
    same = t.dim() == x.dim() and all(a == b for a, b in zip(t.shape, x.shape))
    ck.check_arg(same, op, name, "shape", lambda: f"{ck.shape_str(x.shape)} (x's)", lambda: ck.shape_str(t.shape))


def check_x_weight(op: str, x, weight) -> int:
    ck.check_arg(x.dim() >= 1, op, "x", "rank", "at least 1-D [..., H]", lambda: f"{x.dim()}-D")
    ck.check_arg(x.dtype in DTYPES, op, "x", "dtype", DTYPES_TEXT, x.dtype)
    h = x.shape[-1]
    ck.check_arg(h > 0, op, "x", "size(-1)", "a positive hidden size H", lambda: h)
    if weight is not None:
        ck.check_rank(op, "weight", weight, 1, "[H]")
        ck.check_arg(weight.dtype == x.dtype, op, "weight", "dtype", lambda: f"{x.dtype} (same as 'x')", weight.dtype)
        ck.check_arg(
            weight.device == x.device, op, "weight", "device", lambda: f"{x.device} (same as 'x')", weight.device
        )
        ck.check_dim_size(op, "weight", weight, 0, "H", h, "x.size(-1)")
    return h


def check_scale(op: str, out_scale) -> None:
    ck.check_arg(math.isfinite(out_scale), op, "out_scale", "value", "a finite float", out_scale)


def forward_signature(args, op: str = FORWARD) -> int:
    """Checks an ``rms_norm`` (or ``rms_norm_quant``) call; returns H."""
    x = args.x
    h = check_x_weight(op, x, args.weight)
    ck.check_arg(math.isfinite(args.eps) and args.eps >= 0, op, "eps", "value", "a non-negative finite float", args.eps)
    check_scale(op, args.out_scale)
    check_like_x(op, "residual", args.residual, x)
    return h


def quant_signature(args) -> list:
    """Checks an ``rms_norm_quant`` call; returns the scales' shape."""
    h = forward_signature(args, QUANT)
    ck.check_int_arg(QUANT, "num_per_channels", args.num_per_channels, 1)
    return [*args.x.shape[:-1], -(-h // args.num_per_channels)]


def backward_signature(args) -> None:
    """Checks an ``rms_norm_backward`` call."""
    x = args.x
    check_x_weight(BACKWARD, x, args.weight)
    check_like_x(BACKWARD, "out_grad", args.out_grad, x)
    check_like_x(BACKWARD, "residual_out_grad", args.residual_out_grad, x)
    rstd = args.rstd
    want = compute_dtype(x)
    ck.check_arg(rstd.dtype == want, BACKWARD, "rstd", "dtype", want, rstd.dtype)
    same = rstd.dim() == x.dim() - 1 and all(a == b for a, b in zip(rstd.shape, x.shape[:-1]))
    ck.check_arg(
        same,
        BACKWARD,
        "rstd",
        "shape",
        lambda: f"{ck.shape_str(x.shape[:-1])} (x's rows)",
        lambda: ck.shape_str(rstd.shape),
    )
    ck.check_arg(rstd.device == x.device, BACKWARD, "rstd", "device", lambda: f"{x.device} (same as 'x')", rstd.device)
    check_scale(BACKWARD, args.out_scale)
