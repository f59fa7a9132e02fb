"""The quant family's argument checks (``quantize_fp8``, ``quantize_fp4``, ``dequantize``, ``quantize_blocks``).
Twin: ``csrc/ops/quant_checks.h`` (the same checks in the same order, the same words; tests/test_validation_twins.py
compares them). ``quantize_blocks`` has no C++ kernel: its checks are Python's alone (``PYTHON_ONLY``)."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

QUANTIZE_FP8 = "ascend_moe::quantize_fp8"
QUANTIZE_FP4 = "ascend_moe::quantize_fp4"
DEQUANTIZE = "ascend_moe::dequantize"
QUANTIZE_BLOCKS = "ascend_moe::quantize_blocks"
# TileKernels' formats: (largest code value, default amax floor).
BLOCK_FORMATS = {"e4m3": (448.0, 1e-4), "e2m1": (6.0, 6.0 * 2.0**-126), "e5m6": (65024.0, 1e-4)}
# Integer scale dtypes: UE8M0 codes packed along the last dim, this many per word.
PACKED_SCALES = {torch.int32: 4, torch.int16: 2}
SCALE_DTYPES = (torch.float32, torch.float8_e8m0fnu, *PACKED_SCALES)
# Check functions of ops that no C++ kernel implements (function -> its ops): they have no C++ twin.
PYTHON_ONLY = {"quantize_blocks_signature": (QUANTIZE_BLOCKS,)}


def ceil_div(a, b):
    return (a + b - 1) // b


def check_block(op: str, block) -> None:
    ck.check_arg(
        len(block) == 2 and block[0] > 0 and block[1] > 0,
        op,
        "block",
        "value",
        "[rows, cols] with positive entries",
        lambda: list(block),
    )
    ck.check_arg(
        block[0] <= ck.MAX_INT_ARG and block[1] <= ck.MAX_INT_ARG,
        op,
        "block",
        "value",
        "[rows, cols] with entries at most 2147483647",
        lambda: list(block),
    )


def quantize_signature(op: str, x, block, use_ue8m0: bool, use_packed_ue8m0: bool, fp4: bool):
    """Validates a quantize call; returns (data shape, scale shape, scale dtype)."""
    ck.check_rank(op, "x", x, 2, "[M, N]")
    ck.check_arg(x.dtype in ck.GEMM_DTYPES, op, "x", "dtype", ck.GEMM_DTYPES_TEXT, x.dtype)
    check_block(op, block)
    m, n = x.shape
    if fp4:
        ck.check_arg(n % 2 == 0, op, "x", "size(1)", "an even number (two E2M1 codes per byte)", lambda: n)
    ck.check_arg(not use_packed_ue8m0 or use_ue8m0, op, "use_packed_ue8m0", "value", "False unless use_ue8m0", "True")
    rows, cols = ceil_div(m, block[0]), ceil_div(n, block[1])
    if use_packed_ue8m0:
        return [m, n // 2 if fp4 else n], [rows, ceil_div(cols, 4)], torch.int32
    return [m, n // 2 if fp4 else n], [rows, cols], torch.float32


def dequantize_signature(data, scale, block, out_dtype) -> tuple[list, torch.dtype]:
    """Validates a dequantize call; returns (output shape, output dtype)."""
    op = DEQUANTIZE
    ck.check_rank(op, "data", data, 2, "[M, N] (FP8) or [M, N/2] (FP4 packed in uint8)")
    fp4 = data.dtype == torch.uint8
    ck.check_arg(
        fp4 or data.dtype == torch.float8_e4m3fn,
        op,
        "data",
        "dtype",
        "torch.float8_e4m3fn, or torch.uint8 (packed FP4)",
        data.dtype,
    )
    check_block(op, block)
    ck.check_arg(
        scale.device == data.device, op, "scale", "device", lambda: f"{data.device} (same as 'data')", scale.device
    )
    ck.check_arg(
        scale.dtype in SCALE_DTYPES,
        op,
        "scale",
        "dtype",
        "torch.float32, torch.float8_e8m0fnu, torch.int32 or torch.int16 (packed UE8M0)",
        scale.dtype,
    )
    m, n = data.shape[0], 2 * data.shape[1] if fp4 else data.shape[1]
    per = PACKED_SCALES.get(scale.dtype, 1)
    cols = ceil_div(n, block[1])
    expected = [ceil_div(m, block[0]), ceil_div(cols, per)]
    how = (
        f"(ceil(M / block[0]), ceil(ceil(N / block[1]) / {per}))"
        if per > 1
        else "(ceil(M / block[0]), ceil(N / block[1]))"
    )
    same = scale.dim() == 2 and all(s == e for s, e in zip(scale.shape, expected))
    ck.check_arg(
        same, op, "scale", "shape", lambda: f"{ck.shape_str(expected)} {how}", lambda: ck.shape_str(scale.shape)
    )
    if out_dtype is not None:
        ck.check_arg(out_dtype in ck.GEMM_DTYPES, op, "out_dtype", "value", ck.GEMM_DTYPES_TEXT, out_dtype)
    return [m, n], out_dtype if out_dtype is not None else torch.float32


def quantize_blocks_signature(x, fmt, block, round_sf, sf, amax_clamp) -> tuple[list, list]:
    """Validates a ``quantize_blocks`` call; returns (data shape, sf shape)."""
    op = QUANTIZE_BLOCKS
    ck.check_rank(op, "x", x, 2, "[M, N]")
    ck.check_arg(x.dtype in ck.GEMM_DTYPES, op, "x", "dtype", ck.GEMM_DTYPES_TEXT, x.dtype)
    ck.check_arg(fmt in BLOCK_FORMATS, op, "fmt", "value", "'e4m3', 'e2m1' or 'e5m6'", repr(fmt))
    check_block(op, block)
    m, n = x.shape
    fp4 = fmt == "e2m1"
    if fp4:
        ck.check_arg(n % 2 == 0, op, "x", "size(1)", "an even number (two E2M1 codes per byte)", lambda: n)
    if fmt == "e5m6":
        ck.check_arg(n % 8 == 0, op, "x", "size(1)", "a multiple of 8 (eight E5M6 codes per 12 bytes)", lambda: n)
        ck.check_arg(block[0] == 1, op, "block", "value", "[1, cols] for 'e5m6' (per-row scales)", list(block))
    sf_shape = [ceil_div(m, block[0]), ceil_div(n, block[1])]
    if sf is not None:
        ck.check_arg(sf.dtype == torch.float32, op, "sf", "dtype", torch.float32, sf.dtype)
        ck.check_arg(sf.device == x.device, op, "sf", "device", lambda: f"{x.device} (same as 'x')", sf.device)
        ck.check_arg(
            list(sf.shape) == sf_shape,
            op,
            "sf",
            "shape",
            lambda: ck.shape_str(sf_shape),
            lambda: ck.shape_str(sf.shape),
        )
    if amax_clamp is not None:
        ck.check_arg(
            0 < amax_clamp < float("inf"), op, "amax_clamp", "value", "None or a positive finite float", amax_clamp
        )
    return [m, n // 2 if fp4 else n * 3 // 2 if fmt == "e5m6" else n], sf_shape
