"""The grouped family's argument checks (the m-grouped, masked and k-grouped GEMMs, BF16 and FP8, and the SwiGLU
ops), and the layout's value checks its kernels make. Twin: ``csrc/ops/grouped_checks.h`` (the same checks in the
same order, the same words; tests/test_validation_twins.py compares them).

Output shapes depend only on input shapes (padding rows are zeros), so every op has a static-shape fake. Layout
*values* (sorted psum ends, ids in range, ``masked_m <= M_max``, the k-grouped scale rows) are data: the kernels
check them eagerly (``layout_segments``, ``masked_rows``, ``k_fp8_segments``); a fake cannot, so a traced graph
relies on the kernel's check.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.checks.fp8_gemm import check_fp8_operand, check_fp8_pairing, check_scaled_out_dtype, logical_k
from torch_ascend_moe.checks.fp8_linear import check_high_precision, check_k_blocks

M_GROUPED = "ascend_moe::m_grouped_bf16_gemm"
MASKED = "ascend_moe::m_grouped_bf16_gemm_masked"
K_GROUPED = "ascend_moe::k_grouped_bf16_gemm"
M_GROUPED_FP8 = "ascend_moe::m_grouped_fp8_gemm"
MASKED_FP8 = "ascend_moe::m_grouped_fp8_gemm_masked"
LINEAR_FP8 = "ascend_moe::m_grouped_fp8_linear"
QUANT_FP8 = "ascend_moe::m_grouped_fp8_quant_gemm"
K_GROUPED_FP8 = "ascend_moe::k_grouped_fp8_gemm"
SWIGLU = "ascend_moe::m_grouped_bf16_gemm_swiglu"
SWIGLU_FP8 = "ascend_moe::m_grouped_fp8_gemm_swiglu"


def check_layout_tensor(op: str, layout, psum: bool, length, ref) -> None:
    ck.check_rank(
        op, "layout", layout, 1, "[G] (cumulative group ends)" if psum else "[M] (group id per row, -1 = padding)"
    )
    ck.check_arg(layout.dtype == torch.int32, op, "layout", "dtype", "torch.int32", layout.dtype)
    ck.check_same_device(op, "layout", layout, ref)
    ck.check_dim_size(
        op, "layout", layout, 0, "groups" if psum else "rows", length, "b's groups" if psum else "rows of a"
    )


def check_alignment(op: str, alignment: int) -> None:
    ck.check_int_arg(op, "alignment", alignment, 1)


def layout_segments(op: str, layout: torch.Tensor, psum: bool, alignment: int, rows: int, groups: int) -> list:
    """``[(group, begin, end)]`` row ranges of a layout, validated against its values (a kernel's check: a fake
    cannot see values)."""
    values = layout.tolist()
    segments = []
    if psum:
        prev = 0
        for g, end in enumerate(values):
            start = -(-prev // alignment) * alignment
            ck.check_arg(
                start <= end <= rows,
                op,
                "layout",
                "values",
                f"cumulative group ends (psum): layout[g] >= align(layout[g-1], alignment={alignment}) "
                f"and <= {rows} rows",
                f"layout[{g}] = {end} (group start {start})",
            )
            segments.append((g, start, end))
            prev = end
        return segments
    i = 0
    while i < len(values):
        g = values[i]
        ck.check_arg(
            -1 <= g < groups,
            op,
            "layout",
            "values",
            f"group ids in [-1, {groups}) (-1 = padding row)",
            f"layout[{i}] = {g}",
        )
        j = i + 1
        while j < len(values) and values[j] == g:
            j += 1
        if g >= 0:
            segments.append((g, i, j))
        i = j
    return segments


def check_m_operands(op: str, a, b, b_layout: str) -> None:
    """An m-grouped GEMM's operands: tokens ``a [M, K]``, expert weights ``b [G, N, K]`` of a's dtype and device."""
    ck.check_rank(op, "a", a, 2, "[M, K]")
    ck.check_rank(op, "b", b, 3, b_layout)
    ck.check_operand_dtypes(op, a, b)
    ck.check_same_device(op, "b", b, a)
    ck.check_dim_size(op, "b", b, 2, "K", a.shape[1], "a.size(1)")


def m_grouped_signature(a, b, layout, psum, alignment, out_dtype) -> tuple[list, torch.dtype]:
    check_m_operands(M_GROUPED, a, b, "[G, N, K]")
    check_alignment(M_GROUPED, alignment)
    check_layout_tensor(M_GROUPED, layout, psum, b.shape[0] if psum else a.shape[0], a)
    return [a.shape[0], b.shape[1]], ck.resolve_out_dtype(M_GROUPED, a, None, out_dtype)


def check_even_gate_up(op: str, b) -> None:
    ck.check_arg(b.shape[1] % 2 == 0, op, "b", "size(1) (2I: gate rows, then up rows)", "an even number", b.shape[1])


def check_swiglu_epilogue(
    op: str, a, compute, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype, plain_out
) -> torch.dtype:
    """The epilogue's arguments, checked alike by both SwiGLU ops; the output dtype (``plain_out(out_dtype)``
    without quantization)."""
    if row_weights is not None:
        ck.check_rank(op, "row_weights", row_weights, 1, "[M] (one routing weight per row of a)")
        ck.check_arg(
            row_weights.dtype == compute,
            op,
            "row_weights",
            "dtype",
            lambda: f"{compute} (the epilogue's precision for a {a.dtype})",
            row_weights.dtype,
        )
        ck.check_same_device(op, "row_weights", row_weights, a)
        ck.check_dim_size(op, "row_weights", row_weights, 0, "M", a.shape[0], "a.size(0)")
    if activation_clamp is not None:
        ck.check_arg(activation_clamp >= 0, op, "activation_clamp", "value", "None or >= 0", float(activation_clamp))
    ck.check_int_arg(op, "quant_gran_k", quant_gran_k, 0)
    if quant_gran_k > 0:
        ck.check_arg(
            out_dtype in (None, torch.float8_e4m3fn),
            op,
            "out_dtype",
            "value",
            "None or torch.float8_e4m3fn (quant_gran_k > 0)",
            out_dtype,
        )
        return torch.float8_e4m3fn
    ck.check_arg(not use_ue8m0, op, "use_ue8m0", "value", "False when quant_gran_k=0 (no FP8 output)", "True")
    return plain_out(out_dtype)


def _swiglu_shapes(a, b, quant_gran_k) -> tuple[list, list]:
    inter = b.shape[1] // 2
    scales = -(-inter // quant_gran_k) if quant_gran_k > 0 else 0
    return [a.shape[0], inter], [a.shape[0], scales]


def swiglu_signature(
    a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype
) -> tuple[list, list, torch.dtype]:
    """(output shape ``[M, I]``, scale shape ``[M, ceil(I / quant_gran_k)]`` or ``[M, 0]``, output dtype)."""
    check_m_operands(SWIGLU, a, b, "[G, 2I, K] (gate rows, then up rows)")
    check_even_gate_up(SWIGLU, b)
    check_alignment(SWIGLU, alignment)
    check_layout_tensor(SWIGLU, layout, psum, b.shape[0] if psum else a.shape[0], a)
    compute = torch.float64 if a.dtype == torch.float64 else torch.float32
    dtype = check_swiglu_epilogue(
        SWIGLU,
        a,
        compute,
        row_weights,
        activation_clamp,
        quant_gran_k,
        use_ue8m0,
        out_dtype,
        lambda out: ck.resolve_out_dtype(SWIGLU, a, None, out),
    )
    return (*_swiglu_shapes(a, b, quant_gran_k), dtype)


def check_masked_m(op: str, masked_m, a) -> None:
    ck.check_rank(op, "masked_m", masked_m, 1, "[G]")
    ck.check_arg(masked_m.dtype == torch.int32, op, "masked_m", "dtype", "torch.int32", masked_m.dtype)
    ck.check_same_device(op, "masked_m", masked_m, a)
    ck.check_dim_size(op, "masked_m", masked_m, 0, "groups", a.shape[0], "a.size(0)")


def masked_rows(op: str, masked_m: torch.Tensor, m_max: int) -> list[int]:
    """masked_m's values, each checked to lie in ``[0, M_max]`` (a kernel's check: a fake cannot see values)."""
    rows = masked_m.tolist()
    for g, m in enumerate(rows):
        ck.check_arg(0 <= m <= m_max, op, "masked_m", "values", f"in [0, M_max={m_max}]", f"masked_m[{g}] = {m}")
    return rows


def masked_signature(a, b, masked_m, out_dtype) -> tuple[list, torch.dtype]:
    ck.check_rank(MASKED, "a", a, 3, "[G, M_max, K]")
    ck.check_rank(MASKED, "b", b, 3, "[G, N, K]")
    ck.check_operand_dtypes(MASKED, a, b)
    ck.check_same_device(MASKED, "b", b, a)
    ck.check_dim_size(MASKED, "b", b, 0, "groups", a.shape[0], "a.size(0)")
    ck.check_dim_size(MASKED, "b", b, 2, "K", a.shape[2], "a.size(2)")
    check_masked_m(MASKED, masked_m, a)
    return [a.shape[0], a.shape[1], b.shape[1]], ck.resolve_out_dtype(MASKED, a, None, out_dtype)


def k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype) -> tuple[list, torch.dtype]:
    ck.check_rank(K_GROUPED, "a", a, 2, "[S, M] (rows are the grouped reduction axis)")
    ck.check_rank(K_GROUPED, "b", b, 2, "[S, N]")
    ck.check_operand_dtypes(K_GROUPED, a, b)
    ck.check_same_device(K_GROUPED, "b", b, a)
    ck.check_dim_size(K_GROUPED, "b", b, 0, "S", a.shape[0], "a.size(0)")
    check_alignment(K_GROUPED, alignment)
    ck.check_int_arg(K_GROUPED, "num_groups", num_groups, 0)
    check_layout_tensor(K_GROUPED, layout, psum, num_groups if psum else a.shape[0], a)
    dtype = ck.resolve_out_dtype(K_GROUPED, a, c, out_dtype)
    shape = [num_groups, a.shape[1], b.shape[1]]
    ck.check_accumulator(K_GROUPED, c, a, shape)
    return shape, dtype


def check_row_scales(op: str, recipe_a) -> None:
    """Grouped A scales are per row (gran_mn 1): a block of rows could straddle two experts."""
    ck.check_arg(
        len(recipe_a) == 2 and recipe_a[0] == 1,
        op,
        "recipe_a",
        "value",
        "[1, gran_k] (per-row A scales: a row block could straddle two experts)",
        lambda: list(recipe_a),
    )


def check_grouped_fp8(op, a, sfa, b, sfb, recipe_a, recipe_b, a_batched, out_dtype) -> torch.dtype:
    """Scaled operands of the grouped FP8 GEMMs; returns the output dtype."""
    check_row_scales(op, recipe_a)
    check_fp8_operand(op, "a", "sfa", a, sfa, recipe_a, a, a_batched)
    ck.check_rank(op, "b", b, 3, "[G, N, K] (FP8) or [G, N, K/2] (FP4 packed in uint8)")
    if a_batched:
        ck.check_dim_size(op, "b", b, 0, "groups", a.shape[0], "a.size(0)")
    check_fp8_operand(op, "b", "sfb", b, sfb, recipe_b, a, True)
    check_fp8_pairing(op, a, b)
    return check_scaled_out_dtype(op, None, out_dtype, torch.bfloat16)


def swiglu_fp8_signature(
    a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, row_weights, activation_clamp, quant_gran_k,
    use_ue8m0, out_dtype,
) -> tuple[list, list, torch.dtype]:  # fmt: skip
    """``swiglu_signature`` of ``m_grouped_fp8_gemm_swiglu`` (operands checked as ``m_grouped_fp8_gemm``'s)."""
    check_grouped_fp8(SWIGLU_FP8, a, sfa, b, sfb, recipe_a, recipe_b, False, None)
    check_even_gate_up(SWIGLU_FP8, b)
    check_alignment(SWIGLU_FP8, alignment)
    check_layout_tensor(SWIGLU_FP8, layout, psum, b.shape[0] if psum else a.shape[0], a)
    dtype = check_swiglu_epilogue(
        SWIGLU_FP8,
        a,
        torch.float32,
        row_weights,
        activation_clamp,
        quant_gran_k,
        use_ue8m0,
        out_dtype,
        lambda out: check_scaled_out_dtype(SWIGLU_FP8, None, out, torch.bfloat16),
    )
    return (*_swiglu_shapes(a, b, quant_gran_k), dtype)


def m_grouped_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    dtype = check_grouped_fp8(M_GROUPED_FP8, a, sfa, b, sfb, recipe_a, recipe_b, False, out_dtype)
    check_alignment(M_GROUPED_FP8, alignment)
    check_layout_tensor(M_GROUPED_FP8, layout, psum, b.shape[0] if psum else a.shape[0], a)
    return [a.shape[0], b.shape[1]], dtype


def masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
    dtype = check_grouped_fp8(MASKED_FP8, a, sfa, b, sfb, recipe_a, recipe_b, True, out_dtype)
    check_masked_m(MASKED_FP8, masked_m, a)
    return [a.shape[0], a.shape[1], b.shape[1]], dtype


def m_grouped_fp8_linear_signature(x, weight, layout, psum, alignment, block) -> list:
    """Checks an ``m_grouped_fp8_linear`` call; returns the output shape."""
    check_high_precision(LINEAR_FP8, "x", x, "[M, K]")
    ck.check_rank(LINEAR_FP8, "weight", weight, 3, "[G, N, K]")
    ck.check_arg(
        weight.dtype == x.dtype, LINEAR_FP8, "weight", "dtype", lambda: f"{x.dtype} (same as 'x')", weight.dtype
    )
    ck.check_same_device(LINEAR_FP8, "weight", weight, x)
    ck.check_dim_size(LINEAR_FP8, "weight", weight, 2, "K", x.shape[1], "x.size(1)")
    check_k_blocks(LINEAR_FP8, "block", block, x)
    check_alignment(LINEAR_FP8, alignment)
    check_layout_tensor(LINEAR_FP8, layout, psum, weight.shape[0] if psum else x.shape[0], x)
    return [x.shape[0], weight.shape[1]]


def m_grouped_fp8_quant_signature(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, out_dtype):
    """``m_grouped_fp8_gemm``'s output (shape, dtype) for ``x`` cast per token inside the op (as ``fp8_quant_gemm``:
    BF16/FP32 ``x``, the output in ``x``'s dtype by default)."""
    check_high_precision(QUANT_FP8, "x", x, "[M, K]")
    check_k_blocks(QUANT_FP8, "gran_k", gran_k, x)
    ck.check_rank(QUANT_FP8, "b", b, 3, "[G, N, K] (FP8) or [G, N, K/2] (FP4 packed in uint8)")
    check_fp8_operand(QUANT_FP8, "b", "sfb", b, sfb, recipe_b, x, True)
    ck.check_arg(
        logical_k(b) == x.shape[1],
        QUANT_FP8,
        "b",
        "K",
        lambda: f"{ck._text(x.shape[1])} (x's K)",
        lambda: logical_k(b),
    )
    check_alignment(QUANT_FP8, alignment)
    check_layout_tensor(QUANT_FP8, layout, psum, b.shape[0] if psum else x.shape[0], x)
    return [x.shape[0], b.shape[1]], check_scaled_out_dtype(QUANT_FP8, None, out_dtype, x.dtype)


def k_grouped_fp8_signature(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype):
    """Shapes and dtypes; the scale row count (sum of ceil(k_g / gran_k)) depends on layout values:
    ``k_fp8_segments``."""
    for name, sf_name, x, sf in (("a", "sfa", a, sfa), ("b", "sfb", b, sfb)):
        ck.check_rank(K_GROUPED_FP8, name, x, 2, "[S, MN] (rows are the grouped reduction axis)")
        ck.check_arg(x.dtype == torch.float8_e4m3fn, K_GROUPED_FP8, name, "dtype", "torch.float8_e4m3fn", x.dtype)
        ck.check_same_device(K_GROUPED_FP8, name, x, a)
        ck.check_rank(K_GROUPED_FP8, sf_name, sf, 2, "[sum_g ceil(k_g / gran_k), MN]")
        ck.check_arg(
            sf.dtype in (torch.float32, torch.float8_e8m0fnu),
            K_GROUPED_FP8,
            sf_name,
            "dtype",
            "torch.float32 or torch.float8_e8m0fnu",
            sf.dtype,
        )
        ck.check_same_device(K_GROUPED_FP8, sf_name, sf, a)
        ck.check_dim_size(K_GROUPED_FP8, sf_name, sf, 1, "MN", x.shape[1], f"{name}.size(1)")
    ck.check_dim_size(K_GROUPED_FP8, "b", b, 0, "S", a.shape[0], "a.size(0)")
    ck.check_int_arg(K_GROUPED_FP8, "gran_k", gran_k, 1)
    check_alignment(K_GROUPED_FP8, alignment)
    ck.check_int_arg(K_GROUPED_FP8, "num_groups", num_groups, 0)
    check_layout_tensor(K_GROUPED_FP8, layout, True, num_groups, a)
    dtype = check_scaled_out_dtype(K_GROUPED_FP8, c, out_dtype, torch.float32)
    shape = [num_groups, a.shape[1], b.shape[1]]
    ck.check_accumulator(K_GROUPED_FP8, c, a, shape)
    return shape, dtype


def k_fp8_segments(a, sfa, sfb, layout, num_groups: int, alignment: int, gran_k: int) -> list:
    """``k_grouped_fp8_gemm``'s groups ``(g, begin, end)`` after the value checks: the layout's, then that the scale
    tensors hold one row per ``gran_k`` rows of each group (the layout's values decide how many: a host read)."""
    segments = layout_segments(K_GROUPED_FP8, layout, True, alignment, a.shape[0], num_groups)
    rows = sum(-(-(end - begin) // gran_k) for _, begin, end in segments)
    for name, sf in (("sfa", sfa), ("sfb", sfb)):
        ck.check_arg(
            sf.shape[0] == rows,
            K_GROUPED_FP8,
            name,
            "size(0)",
            f"{rows} (sum over groups of ceil(k_g / gran_k))",
            lambda sf=sf: sf.shape[0],
        )
    return segments
