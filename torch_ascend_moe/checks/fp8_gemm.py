"""The fp8_gemm family's argument checks (``fp8_gemm``, ``fp8_bmm``, ``fp8_einsum``), and the scaled-operand checks
the fp8_linear and grouped families build on. Twin: ``csrc/ops/fp8_gemm_checks.h`` (the same checks in the same
order, the same words; tests/test_validation_twins.py compares them).

Each ``*_signature`` function validates a call and returns its output shape and dtype.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

OP = "ascend_moe::fp8_gemm"
BMM = "ascend_moe::fp8_bmm"
EINSUM = "ascend_moe::fp8_einsum"
EQUATIONS = ("bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr")


def is_fp4(t: torch.Tensor) -> bool:
    """Packed FP4 crosses the op boundary as uint8, two E2M1 codes per byte along K."""
    return t.dtype == torch.uint8


def logical_k(t: torch.Tensor):
    """K of an operand: packed FP4 stores two values per byte along K."""
    return 2 * t.shape[-1] if is_fp4(t) else t.shape[-1]


def check_scale_shape(op: str, sf_name: str, sf, expected: list, how: str) -> None:
    same = sf.dim() == len(expected) and all(s == e for s, e in zip(sf.shape, expected))
    ck.check_arg(same, op, sf_name, "shape", lambda: f"{ck.shape_str(expected)} {how}", lambda: ck.shape_str(sf.shape))


def check_fp8_operand(op: str, name: str, sf_name: str, x, sf, recipe, ref, batched: bool) -> None:
    """One scaled operand: data ``[MN, K]`` (``[G, MN, K]`` when batched), its scales and recipe."""
    lead = 1 if batched else 0
    ck.check_rank(
        op,
        name,
        x,
        2 + lead,
        "[G, MN, K] (FP8) or [G, MN, K/2] (FP4 packed in uint8)"
        if batched
        else "[MN, K] (FP8) or [MN, K/2] (FP4 packed in uint8)",
    )
    ck.check_arg(
        x.dtype in (torch.float8_e4m3fn, torch.uint8),
        op,
        name,
        "dtype",
        "torch.float8_e4m3fn, or torch.uint8 (packed FP4)",
        x.dtype,
    )
    if is_fp4(x):
        ck.check_arg(
            x.stride(-1) == 1, op, name, f"stride({x.dim() - 1})", "1 (packed FP4 is K-major)", lambda: x.stride(-1)
        )
    ck.check_same_device(op, name, x, ref)
    ck.check_same_device(op, sf_name, sf, ref)
    ck.check_recipe(op, f"recipe_{name}", recipe)
    mn, k = x.shape[lead], logical_k(x)
    gmn, gk = recipe
    ck.check_arg(k % gk == 0, op, name, "K", f"a multiple of gran_k={gk}", lambda: k)
    ck.check_scale_dtype(op, sf_name, sf)
    sf_shape = [x.shape[0]] * lead + [(mn + gmn - 1) // gmn, k // gk]
    check_scale_shape(
        op,
        sf_name,
        sf,
        sf_shape,
        "(G, ceil(MN / gran_mn), K / gran_k)" if batched else "(ceil(MN / gran_mn), K / gran_k)",
    )


def check_fp8_pairing(op: str, a, b) -> None:
    """Operands that may meet: FP4 A needs FP4 B (FP4 x FP8 is unsupported upstream), and one logical K."""
    ck.check_arg(
        not (is_fp4(a) and not is_fp4(b)),
        op,
        "a",
        "dtype",
        "FP8 when b is FP8 (FP4 x FP8 is unsupported, as upstream)",
        "torch.uint8 (packed FP4)",
    )
    ck.check_arg(
        logical_k(b) == logical_k(a), op, "b", "K", lambda: f"{ck._text(logical_k(a))} (a's K)", lambda: logical_k(b)
    )


def check_scaled_out_dtype(op: str, c, out_dtype, fallback: torch.dtype) -> torch.dtype:
    """out_dtype if given, else c's dtype, else ``fallback``; BF16 or FP32 only, and c must agree."""
    if out_dtype is not None:
        ck.check_arg(
            out_dtype in (torch.bfloat16, torch.float32),
            op,
            "out_dtype",
            "value",
            "torch.bfloat16 or torch.float32",
            out_dtype,
        )
    dtype = out_dtype if out_dtype is not None else (c.dtype if c is not None else fallback)
    if c is not None and out_dtype is None:  # c's dtype is the output dtype: the same two choices
        ck.check_arg(
            dtype in (torch.bfloat16, torch.float32), op, "c", "dtype", "torch.bfloat16 or torch.float32", dtype
        )
    if c is not None:
        ck.check_arg(c.dtype == dtype, op, "c", "dtype", lambda: f"{dtype} (out_dtype)", c.dtype)
    return dtype


def check_fp8_pair(op, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype, batched: bool) -> torch.dtype:
    """Both operands and their pairing; returns the output dtype."""
    check_fp8_operand(op, "a", "sfa", a, sfa, recipe_a, a, batched)
    if batched:
        ck.check_rank(op, "b", b, 3, "[G, MN, K] (FP8) or [G, MN, K/2] (FP4 packed in uint8)")
        ck.check_dim_size(op, "b", b, 0, "batch", a.shape[0], "a.size(0)")
    check_fp8_operand(op, "b", "sfb", b, sfb, recipe_b, a, batched)
    check_fp8_pairing(op, a, b)
    return check_scaled_out_dtype(op, c, out_dtype, torch.bfloat16)


def fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype) -> tuple[list, torch.dtype]:
    dtype = check_fp8_pair(OP, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype, False)
    shape = [a.shape[0], b.shape[0]]
    ck.check_accumulator(OP, c, a, shape)
    return shape, dtype


def fp8_bmm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype) -> tuple[list, torch.dtype]:
    dtype = check_fp8_pair(BMM, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype, True)
    shape = [a.shape[0], a.shape[1], b.shape[1]]
    ck.check_accumulator(BMM, c, a, shape)
    return shape, dtype


def einsum_plan(equation: str) -> tuple[str, str, str, list, list, list]:
    """Subscripts of a, b, out and the permutations putting each in batched-GEMM order (h, m|n, k)."""
    sa, sb, so = equation[0:3], equation[4:7], equation[9:]
    m = next(x for x in sa if x != "h" and x in so)
    n = next(x for x in sb if x != "h" and x in so)
    k = next(x for x in sa if x != "h" and x not in so)
    return (
        sa,
        sb,
        so,
        [sa.index(x) for x in "h" + m + k],
        [sb.index(x) for x in "h" + n + k],
        [so.index(x) for x in "h" + m + n],
    )


def fp8_einsum_signature(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype) -> tuple[list, torch.dtype]:
    expected = "one of " + ", ".join(f"'{e}'" for e in EQUATIONS)
    ck.check_arg(equation in EQUATIONS, EINSUM, "equation", "value", expected, f"'{equation}'")
    sa, sb, so, perm_a, perm_b, _ = einsum_plan(equation)
    k = sa[perm_a[2]]
    for name, x, subs in (("a", a, sa), ("b", b, sb)):
        ck.check_rank(EINSUM, name, x, 3, f"[{subs}]")
        ck.check_arg(
            x.dtype == torch.float8_e4m3fn,
            EINSUM,
            name,
            "dtype",
            "torch.float8_e4m3fn (fp8_einsum takes FP8 operands)",
            x.dtype,
        )
    ck.check_same_device(EINSUM, "b", b, a)
    for j, label in enumerate(sb):
        i = sa.find(label)
        if i >= 0:
            ck.check_dim_size(EINSUM, "b", b, j, f"'{label}'", a.shape[i], f"a.size({i})")
    for name, sf_name, x, sf, subs, perm, recipe in (
        ("a", "sfa", a, sfa, sa, perm_a, recipe_a),
        ("b", "sfb", b, sfb, sb, perm_b, recipe_b),
    ):
        ck.check_recipe(EINSUM, f"recipe_{name}", recipe)
        kdim, letter = subs.index(k), subs[perm[1]]
        ck.check_arg(
            x.shape[kdim] % recipe[1] == 0,
            EINSUM,
            name,
            f"size({kdim}) ('{k}')",
            f"a multiple of gran_k={recipe[1]}",
            lambda x=x, kdim=kdim: x.shape[kdim],
        )
        scale_shape = [
            x.shape[j] if c_ == "h" else -(-x.shape[j] // recipe[0]) if c_ == letter else x.shape[j] // recipe[1]
            for j, c_ in enumerate(subs)
        ]
        check_scale_shape(
            EINSUM, sf_name, sf, scale_shape, f"([{subs}] with '{letter}' / gran_mn rounded up, '{k}' / gran_k)"
        )
    dtype = check_fp8_pair(
        EINSUM,
        a.permute(perm_a),
        sfa.permute(perm_a),
        b.permute(perm_b),
        sfb.permute(perm_b),
        c,
        recipe_a,
        recipe_b,
        out_dtype,
        True,
    )
    shape = [b.shape[sb.index(x)] if x not in sa else a.shape[sa.index(x)] for x in so]
    ck.check_accumulator(EINSUM, c, a, shape)
    return shape, dtype
