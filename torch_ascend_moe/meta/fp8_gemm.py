"""Fake of ``fp8_gemm`` and the validation its Python kernels share (twin of ``csrc/ops/fp8_gemm_cpu.cpp``)."""

from __future__ import annotations

import torch

from torch_ascend_moe import _checks as ck

OP = "ascend_moe::fp8_gemm"
SCALE_DTYPES = (torch.float32, torch.float8_e8m0fnu)


def is_fp4(t: torch.Tensor) -> bool:
    return t.dtype == torch.uint8


def logical_k(t: torch.Tensor):
    """K of an operand: packed FP4 stores two values per byte along K."""
    return 2 * t.shape[1] if is_fp4(t) else t.shape[1]


def _check_operand(name: str, sf_name: str, x, sf, recipe, ref) -> None:
    ck.check_rank(OP, name, x, 2, "[MN, K] (FP8) or [MN, K/2] (FP4 packed in uint8)")
    ck.check_arg(
        x.dtype in (torch.float8_e4m3fn, torch.uint8),
        OP,
        name,
        "dtype",
        "torch.float8_e4m3fn, or torch.uint8 (packed FP4)",
        x.dtype,
    )
    if is_fp4(x):
        ck.check_arg(x.stride(1) == 1, OP, name, "stride(1)", "1 (packed FP4 is K-major)", lambda: x.stride(1))
    ck.check_same_device(OP, name, x, ref)
    ck.check_same_device(OP, sf_name, sf, ref)
    ck.check_arg(
        len(recipe) == 2 and recipe[0] > 0 and recipe[1] > 0,
        OP,
        f"recipe_{name}",
        "value",
        "[gran_mn, gran_k] with positive entries",
        lambda: list(recipe),
    )
    mn, k = x.shape[0], logical_k(x)
    gmn, gk = recipe
    ck.check_arg(k % gk == 0, OP, name, "K", f"a multiple of gran_k={gk}", lambda: k)
    ck.check_arg(
        sf.dtype in SCALE_DTYPES,
        OP,
        sf_name,
        "dtype",
        "torch.float32 or torch.float8_e8m0fnu (unpack int32/int16 UE8M0 first)",
        sf.dtype,
    )
    expected = [(mn + gmn - 1) // gmn, k // gk]
    same = sf.dim() == 2 and sf.shape[0] == expected[0] and sf.shape[1] == expected[1]
    ck.check_arg(
        same,
        OP,
        sf_name,
        "shape",
        lambda: f"{ck.shape_str(expected)} (ceil(MN / gran_mn), K / gran_k)",
        lambda: ck.shape_str(sf.shape),
    )


def fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype) -> tuple[list, torch.dtype]:
    _check_operand("a", "sfa", a, sfa, recipe_a, a)
    _check_operand("b", "sfb", b, sfb, recipe_b, a)
    ck.check_arg(
        not (is_fp4(a) and not is_fp4(b)),
        OP,
        "a",
        "dtype",
        "FP8 when b is FP8 (FP4 x FP8 is unsupported, as upstream)",
        "torch.uint8 (packed FP4)",
    )
    ck.check_arg(
        logical_k(b) == logical_k(a), OP, "b", "K", lambda: f"{ck._text(logical_k(a))} (a's K)", lambda: logical_k(b)
    )
    if out_dtype is not None:
        ck.check_arg(
            out_dtype in (torch.bfloat16, torch.float32),
            OP,
            "out_dtype",
            "value",
            "torch.bfloat16 or torch.float32",
            out_dtype,
        )
    dtype = out_dtype if out_dtype is not None else (c.dtype if c is not None else torch.bfloat16)
    if c is not None:
        ck.check_arg(c.dtype == dtype, OP, "c", "dtype", lambda: f"{dtype} (out_dtype)", c.dtype)
    shape = [a.shape[0], b.shape[0]]
    ck.check_accumulator(OP, c, a, shape)
    return shape, dtype


@torch.library.register_fake(OP)
def _fp8_gemm_fake(a, sfa, b, sfb, c=None, recipe_a=(1, 128), recipe_b=(128, 128), alpha=1.0, out_dtype=None):
    shape, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    return a.new_empty(shape, dtype=dtype)
