"""The fp8_linear family's argument checks (``fp8_quant_gemm``, ``fp8_linear``), and those the grouped family's ops
that cast their own inputs share (``m_grouped_fp8_linear``, ``m_grouped_fp8_quant_gemm``). Twin:
``csrc/ops/fp8_linear_checks.h`` (the same checks in the same order, the same words; tests/test_validation_twins.py
compares them)."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.checks.fp8_gemm import check_fp8_operand, check_scaled_out_dtype, logical_k

QUANT_GEMM = "ascend_moe::fp8_quant_gemm"
LINEAR = "ascend_moe::fp8_linear"
HIGH_PRECISION = (torch.bfloat16, torch.float32)


def check_high_precision(op: str, name: str, x, layout: str) -> None:
    """A BF16/FP32 operand of ``layout``'s rank, the inputs these ops cast themselves."""
    ck.check_rank(op, name, x, 2, layout)
    ck.check_arg(x.dtype in HIGH_PRECISION, op, name, "dtype", "torch.bfloat16 or torch.float32", x.dtype)


def check_k_blocks(op: str, arg: str, block: int, x) -> None:
    """``block`` (the argument ``arg``) is positive and divides ``x``'s K: the cast takes whole 1 x block groups."""
    ck.check_int_arg(op, arg, block, 1)
    ck.check_arg(x.shape[1] % block == 0, op, "x", "size(1) (K)", f"a multiple of {arg}={block}", lambda: x.shape[1])


def fp8_quant_gemm_signature(x, b, sfb, c, gran_k, recipe_b, out_dtype) -> tuple[list, torch.dtype]:
    check_high_precision(QUANT_GEMM, "x", x, "[M, K]")
    check_k_blocks(QUANT_GEMM, "gran_k", gran_k, x)
    check_fp8_operand(QUANT_GEMM, "b", "sfb", b, sfb, recipe_b, x, False)
    ck.check_arg(
        logical_k(b) == x.shape[1],
        QUANT_GEMM,
        "b",
        "K",
        lambda: f"{ck._text(x.shape[1])} (x's K)",
        lambda: logical_k(b),
    )
    dtype = check_scaled_out_dtype(QUANT_GEMM, c, out_dtype, x.dtype)
    shape = [x.shape[0], b.shape[0]]
    ck.check_accumulator(QUANT_GEMM, c, x, shape)
    return shape, dtype


def fp8_linear_signature(x, weight, bias, block) -> list:
    """Checks an ``fp8_linear`` call; returns the output shape."""
    check_high_precision(LINEAR, "x", x, "[M, K]")
    ck.check_rank(LINEAR, "weight", weight, 2, "[N, K]")
    ck.check_arg(weight.dtype == x.dtype, LINEAR, "weight", "dtype", lambda: f"{x.dtype} (same as 'x')", weight.dtype)
    ck.check_arg(
        weight.device == x.device, LINEAR, "weight", "device", lambda: f"{x.device} (same as 'x')", weight.device
    )
    ck.check_dim_size(LINEAR, "weight", weight, 1, "K", x.shape[1], "x.size(1)")
    check_k_blocks(LINEAR, "block", block, x)
    n = weight.shape[0]
    if bias is not None:
        ck.check_arg(
            bias.dim() == 1 and bias.shape[0] == n,
            LINEAR,
            "bias",
            "shape",
            lambda: f"[{ck._text(n)}] (weight.size(0))",
            lambda: ck.shape_str(bias.shape),
        )
        ck.check_arg(bias.dtype == x.dtype, LINEAR, "bias", "dtype", lambda: f"{x.dtype} (same as 'x')", bias.dtype)
        ck.check_arg(
            bias.device == x.device, LINEAR, "bias", "device", lambda: f"{x.device} (same as 'x')", bias.device
        )
    return [x.shape[0], n]
