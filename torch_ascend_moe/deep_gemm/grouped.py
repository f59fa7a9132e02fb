"""DeepGEMM(-Ascend)'s grouped GEMMs for MoE (specs/deepgemm_api.md §4-6, §16.2) over the grouped-family ops.

- ``m_grouped_*_gemm_{nt,nn}_contiguous``: ``grouped_layout`` is one expert id per row (``-1`` = padding,
  any ``M``) or, with ``use_psum_layout``, cumulative group ends whose segments start at multiples of
  ``get_mk_alignment_for_contiguous_layout()``. ``-1`` rows of ``d`` are always written as zeros (as
  upstream's kernels and tests); psum gap rows are zeros with ``ensure_zero_padding=True``, left untouched
  with ``False``. ``expected_m_for_psum_layout`` is a hint (psum only), ignored.
- ``m_grouped_*_gemm_nt_masked``: rows at or beyond ``masked_m[g]`` of ``d`` are left untouched.
- ``k_grouped_bf16_gemm_tn_contiguous``: ``d[g] = c[g] + a[rows_g]^T b[rows_g]``; ``c`` is required (as
  upstream asserts; pass ``c=d`` to accumulate in place).
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.deep_gemm.fp8_gemm import _check_packings, _logical, _pair, _resolve_recipes
from torch_ascend_moe.deep_gemm.gemm import _check_dtype, _check_out
from torch_ascend_moe.deep_gemm.runtime import get_mk_alignment_for_contiguous_layout
from torch_ascend_moe.ops.grouped import (
    k_grouped_bf16_gemm as _k_grouped_op,
)
from torch_ascend_moe.ops.grouped import (
    k_grouped_fp8_gemm as _k_grouped_fp8_op,
)
from torch_ascend_moe.ops.grouped import (
    m_grouped_bf16_gemm as _m_grouped_op,
)
from torch_ascend_moe.ops.grouped import (
    m_grouped_bf16_gemm_masked as _masked_op,
)
from torch_ascend_moe.ops.grouped import (
    m_grouped_fp8_gemm as _m_grouped_fp8_op,
)
from torch_ascend_moe.ops.grouped import (
    m_grouped_fp8_gemm_masked as _masked_fp8_op,
)
from torch_ascend_moe.quant import decode_e2m1, scales_to_float, unpack_e2m1


def _psum_owned_rows(layout: torch.Tensor, alignment: int, rows: int) -> torch.Tensor:
    """[rows] bool: rows some group of a psum layout owns (tensor ops, so this also traces)."""
    r = torch.arange(rows, device=layout.device)
    ends = layout.long()
    prev = torch.cat([ends.new_zeros(1), ends[:-1]])
    starts = (prev + alignment - 1) // alignment * alignment
    return ((r[:, None] >= starts) & (r[:, None] < ends)).any(dim=1)


def _layout_args(api, grouped_layout, use_psum_layout, expected_m_for_psum_layout) -> int:
    # M need not be a multiple of the alignment with an id layout: upstream's kernels take any M (callers
    # such as transformers size `a` with an upper bound of padded rows), only segment starts are aligned.
    ck.check_arg(
        expected_m_for_psum_layout is None or use_psum_layout,
        api,
        "expected_m_for_psum_layout",
        "value",
        "None unless use_psum_layout=True",
        expected_m_for_psum_layout,
    )
    return get_mk_alignment_for_contiguous_layout()


def _psum_stored_rows(layout: torch.Tensor, alignment: int, rows: int) -> torch.Tensor:
    """[rows] bool: rows before the last group's aligned end (its groups' rows and the zeroed gaps after each);
    upstream's psum scheduler stops after the last group, so rows past it are never stored."""
    r = torch.arange(rows, device=layout.device)
    if layout.numel() == 0:
        return r < 0
    return r < (layout[-1:].long() + alignment - 1) // alignment * alignment


def _kept_rows(grouped_layout, use_psum_layout, ensure_zero_padding, alignment, rows) -> torch.Tensor | None:
    """Rows of ``d`` to write (None: all). An id layout writes every row, its ``-1`` rows as zeros, whatever
    ``ensure_zero_padding`` says (upstream's kernels store whole tiles; its tests compare all of ``d``); a
    psum layout writes its groups' rows, plus the gap rows (zeros) up to the last group's aligned end with
    ``ensure_zero_padding``; rows after that keep their contents either way."""
    if not use_psum_layout:
        return None
    if ensure_zero_padding:
        return _psum_stored_rows(grouped_layout, alignment, rows)
    return _psum_owned_rows(grouped_layout, alignment, rows)


def _write_rows(d: torch.Tensor, out: torch.Tensor, keep: torch.Tensor | None) -> None:
    """d := out, or only the rows where ``keep`` is True (``keep`` has d's shape minus its last dim)."""
    d.copy_(out if keep is None else torch.where(keep.unsqueeze(-1), out, d))


def _m_grouped_bf16(api, a, b, d, grouped_layout, use_psum_layout, ensure_zero_padding, expected_m) -> None:
    _check_dtype(api, "a", a, (torch.bfloat16,), "torch.bfloat16")
    _check_dtype(api, "b", b, (torch.bfloat16,), "torch.bfloat16")
    alignment = _layout_args(api, grouped_layout, use_psum_layout, expected_m)
    ck.check_rank(api, "b", b, 3, "[G, N, K]")
    _check_out(api, d, None, [a.shape[0], b.shape[1]])
    if a.shape[0] == 0:
        return
    out = _m_grouped_op(a, b, grouped_layout, psum=use_psum_layout, alignment=alignment, out_dtype=d.dtype)
    _write_rows(d, out, _kept_rows(grouped_layout, use_psum_layout, ensure_zero_padding, alignment, a.shape[0]))


def m_grouped_bf16_gemm_nt_contiguous(
    a,
    b,
    d,
    grouped_layout,
    compiled_dims="nk",
    use_psum_layout=False,
    ensure_zero_padding=True,
    expected_m_for_psum_layout=None,
) -> None:
    """``d[i] = a[i] @ b[g(i)]^T``: ``a[M, K]``, ``b[G, N, K]``, ``d[M, N]``."""
    _m_grouped_bf16(
        "deep_gemm.m_grouped_bf16_gemm_nt_contiguous",
        a,
        b,
        d,
        grouped_layout,
        use_psum_layout,
        ensure_zero_padding,
        expected_m_for_psum_layout,
    )


def m_grouped_bf16_gemm_nn_contiguous(
    a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=False, ensure_zero_padding=True
) -> None:
    """As ``_nt`` with ``b[G, K, N]``."""
    _m_grouped_bf16(
        "deep_gemm.m_grouped_bf16_gemm_nn_contiguous",
        a,
        b.transpose(1, 2),
        d,
        grouped_layout,
        use_psum_layout,
        ensure_zero_padding,
        None,
    )


def _m_grouped_fp8(
    api,
    a,
    b,
    d,
    grouped_layout,
    recipe,
    recipe_a,
    recipe_b,
    use_psum_layout,
    ensure_zero_padding,
    expected_m,
    b_t=False,
) -> None:
    a_data, sfa = _pair(api, "a", a)
    b_data, sfb = _pair(api, "b", b)
    _check_packings(api, sfa, sfb)
    ra, rb = _resolve_recipes(api, recipe, recipe_a, recipe_b, sfb)
    alignment = _layout_args(api, grouped_layout, use_psum_layout, expected_m)
    a_data, sfa = _logical(a_data, sfa, False, ra[1])
    b_data, sfb = _logical(b_data, sfb, b_t, rb[1])
    _check_out(api, d, None, [a_data.shape[0], b_data.shape[1]])
    if a_data.shape[0] == 0:
        return
    out = _m_grouped_fp8_op(
        a_data,
        sfa,
        b_data,
        sfb,
        grouped_layout,
        psum=use_psum_layout,
        alignment=alignment,
        recipe_a=ra,
        recipe_b=rb,
        out_dtype=d.dtype,
    )
    rows = a_data.shape[0]
    _write_rows(d, out, _kept_rows(grouped_layout, use_psum_layout, ensure_zero_padding, alignment, rows))


def m_grouped_fp8_fp4_gemm_nt_contiguous(
    a,
    b,
    d,
    grouped_layout,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    compiled_dims="nk",
    disable_ue8m0_cast=False,
    use_psum_layout=False,
    ensure_zero_padding=True,
    expected_m_for_psum_layout=None,
) -> None:
    """Scaled ``m_grouped_bf16_gemm_nt_contiguous``: ``a = (A[M, K], sfa)``, ``b = (B[G, N, K], sfb)``."""
    _m_grouped_fp8(
        "deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous",
        a,
        b,
        d,
        grouped_layout,
        recipe,
        recipe_a,
        recipe_b,
        use_psum_layout,
        ensure_zero_padding,
        expected_m_for_psum_layout,
    )


def m_grouped_fp8_fp4_gemm_nn_contiguous(
    a,
    b,
    d,
    grouped_layout,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    compiled_dims="nk",
    disable_ue8m0_cast=False,
    use_psum_layout=False,
    ensure_zero_padding=True,
) -> None:
    """As ``_nt`` with ``b = (B[G, K, N], sfb[G, K-blocks, N-blocks])``."""
    _m_grouped_fp8(
        "deep_gemm.m_grouped_fp8_fp4_gemm_nn_contiguous",
        a,
        b,
        d,
        grouped_layout,
        recipe,
        recipe_a,
        recipe_b,
        use_psum_layout,
        ensure_zero_padding,
        None,
        b_t=True,
    )


def _valid_rows(masked_m: torch.Tensor, m_max: int) -> torch.Tensor:
    return torch.arange(m_max, device=masked_m.device) < masked_m.unsqueeze(1)


def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, compiled_dims="nk") -> None:
    """``d[g, i] = a[g, i] @ b[g]^T`` for ``i < masked_m[g]``; other rows of ``d`` untouched."""
    api = "deep_gemm.m_grouped_bf16_gemm_nt_masked"
    _check_dtype(api, "a", a, (torch.bfloat16,), "torch.bfloat16")
    ck.check_arg(expected_m > 0, api, "expected_m", "value", "a positive hint", expected_m)
    _check_out(api, d, None, [a.shape[0], a.shape[1], b.shape[1]])
    out = _masked_op(a, b, masked_m, out_dtype=d.dtype)
    _write_rows(d, out, _valid_rows(masked_m, a.shape[1]))


def m_grouped_fp8_fp4_gemm_nt_masked(
    a,
    b,
    d,
    masked_m,
    expected_m,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    compiled_dims="nk",
    disable_ue8m0_cast=False,
) -> None:
    """Scaled ``m_grouped_bf16_gemm_nt_masked``: ``a = (A[G, M_max, K], sfa)``, ``b = (B[G, N, K], sfb)``."""
    api = "deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked"
    a_data, sfa = _pair(api, "a", a)
    b_data, sfb = _pair(api, "b", b)
    _check_packings(api, sfa, sfb)
    ra, rb = _resolve_recipes(api, recipe, recipe_a, recipe_b, sfb)
    ck.check_arg(expected_m > 0, api, "expected_m", "value", "a positive hint", expected_m)
    a_data, sfa = _logical(a_data, sfa, False, ra[1])
    b_data, sfb = _logical(b_data, sfb, False, rb[1])
    _check_out(api, d, None, [a_data.shape[0], a_data.shape[1], b_data.shape[1]])
    out = _masked_fp8_op(a_data, sfa, b_data, sfb, masked_m, recipe_a=ra, recipe_b=rb, out_dtype=d.dtype)
    _write_rows(d, out, _valid_rows(masked_m, a_data.shape[1]))


def k_grouped_bf16_gemm_tn_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, compiled_dims="mn", use_psum_layout=False
) -> None:
    """``d[g] = c[g] + a[rows_g]^T @ b[rows_g]``: ``a[sum_k, M]``, ``b[sum_k, N]``, ``d[G, M, N]``.

    Non-psum: ``grouped_layout`` = per-group K sizes (each a multiple of the alignment, summing to
    ``a.size(0)``); psum: cumulative ends, groups starting at aligned offsets.
    """
    api = "deep_gemm.k_grouped_bf16_gemm_tn_contiguous"
    _check_dtype(api, "a", a, (torch.bfloat16,), "torch.bfloat16")
    ck.check_rank(api, "a", a, 2, "[sum_k, M] matrix")
    ck.check_rank(api, "b", b, 2, "[sum_k, N] matrix")
    ck.check_rank(api, "grouped_layout", grouped_layout, 1, "[G] tensor")
    groups = grouped_layout.shape[0]
    _check_out(api, d, c, [groups, a.shape[1], b.shape[1]])
    ends, alignment = _k_grouped_ends(
        api, a.shape[0], ks_cpu, grouped_layout, use_psum_layout, get_mk_alignment_for_contiguous_layout()
    )
    out = _k_grouped_op(a, b, ends, groups, c, psum=True, alignment=alignment, out_dtype=d.dtype)
    d.copy_(out)


def _k_grouped_ends(api, a_rows, ks_cpu, grouped_layout, use_psum_layout, alignment) -> tuple[torch.Tensor, int]:
    """(psum ends, alignment) of upstream's k-grouped layout (per-group sizes, or psum ends)."""
    groups = grouped_layout.shape[0]
    if use_psum_layout:
        return grouped_layout, alignment
    ck.check_arg(
        ks_cpu is not None and len(ks_cpu) == groups, api, "ks_cpu", "value", f"a list of {groups} sizes", ks_cpu
    )
    ck.check_arg(
        all(k % alignment == 0 for k in ks_cpu), api, "ks_cpu", "value", f"multiples of {alignment}", list(ks_cpu)
    )
    ck.check_arg(sum(ks_cpu) == a_rows, api, "ks_cpu", "sum", a_rows, sum(ks_cpu))
    return grouped_layout.cumsum(0).to(torch.int32), 1


def _k_grouped_scales(sf: torch.Tensor, ends: list[int], alignment: int, gran_k: int) -> torch.Tensor:
    """FP32 per-channel scales from FP32 / e8m0 ones, or from int32 UE8M0 packed 4 rows per row per group."""
    if sf.dtype != torch.int32:
        return scales_to_float(sf)
    groups, start = [], 0
    for end in ends:
        start = -(-start // alignment) * alignment
        groups.append((-(-(end - start) // gran_k), -(-(end - start) // alignment) * alignment // gran_k))
        start = end
    # Packed from compact rows (2.6.1) or from each group's aligned rows (2.8): told apart by the row count; a
    # group's compact rows are the first of its aligned ones either way.
    padded = sum(-(-p // 4) for _, p in groups)
    use_padded = sf.shape[0] == padded and padded != sum(-(-n // 4) for n, _ in groups)
    rows, offset = [], 0
    for n, p in groups:
        packed = -(-(p if use_padded else n) // 4)
        rows.append(scales_to_float(sf[offset : offset + packed].T.contiguous()).T[:n])
        offset += packed
    return torch.cat(rows) if rows else sf.new_empty(0, sf.shape[1], dtype=torch.float32)


def _compact_scales(sf: torch.Tensor, ends: list[int], alignment: int, gran_k: int) -> torch.Tensor:
    """DeepGEMM 2.8's k-grouped scales (a row per ``gran_k`` physical rows of A, groups at aligned starts) as the
    op's compact rows (each group's ``ceil(k_g / gran_k)``); compact scales (2.6.1) pass through."""
    starts, start = [], 0
    for end in ends:
        start = -(-start // alignment) * alignment
        starts.append((start, end))
        start = end
    compact = sum(-(-(e - b) // gran_k) for b, e in starts)
    if sf.shape[0] == compact:
        return sf
    rows = [torch.arange(b // gran_k, b // gran_k + -(-(e - b) // gran_k)) for b, e in starts]
    return sf[torch.cat(rows).to(sf.device)] if rows else sf[:0]


def k_grouped_fp8_gemm_tn_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 128), compiled_dims="mn", use_psum_layout=False
) -> None:
    """FP8 weight gradients ``d[g] = c[g] + deq(A)[rows_g]^T deq(B)[rows_g]``: ``a = (A[sum_k, M], sfa)``,
    ``b = (B[sum_k, N], sfb)`` with per-channel scales along K (FP32 ``[S', MN]`` or int32 packed per group),
    ``recipe = (1, 1, gran_k)``, ``d[G, M, N]`` (``c=d`` accumulates; without ``c`` the product is written, as
    DeepGEMM 2.8 on SM100 does). FP32 scales come compact (2.6.1: ``ceil(k_g / gran_k)`` rows per group) or, as
    2.8 lays them out, one row per ``gran_k`` physical rows of ``A`` (groups padded to the alignment): told apart by
    their row count."""
    api = "deep_gemm.k_grouped_fp8_gemm_tn_contiguous"
    a_data, sfa = _pair(api, "a", a)
    b_data, sfb = _pair(api, "b", b)
    ck.check_arg(
        len(recipe) == 3 and recipe[0] == 1 and recipe[1] == 1, api, "recipe", "value", "(1, 1, gran_k)", tuple(recipe)
    )
    ck.check_rank(api, "a", a_data, 2, "[sum_k, M] matrix")
    ck.check_rank(api, "b", b_data, 2, "[sum_k, N] matrix")
    ck.check_rank(api, "grouped_layout", grouped_layout, 1, "[G] tensor")
    groups = grouped_layout.shape[0]
    _check_out(api, d, c, [groups, a_data.shape[1], b_data.shape[1]])
    ends, alignment = _k_grouped_ends(
        api, a_data.shape[0], ks_cpu, grouped_layout, use_psum_layout, get_mk_alignment_for_contiguous_layout()
    )
    gran_k = recipe[2]
    if sfa.dtype == torch.int32 or sfb.dtype == torch.int32:
        host_ends = ends.tolist()
        sfa, sfb = (_k_grouped_scales(sf, host_ends, alignment, gran_k) for sf in (sfa, sfb))
    elif a_data.shape[0] % gran_k == 0 and sfa.shape[0] == a_data.shape[0] // gran_k:
        sfa, sfb = (_compact_scales(sf, ends.tolist(), alignment, gran_k) for sf in (sfa, sfb))
    out = _k_grouped_fp8_op(
        a_data, sfa, b_data, sfb, ends, groups, c, alignment=alignment, gran_k=gran_k, out_dtype=d.dtype
    )
    d.copy_(out)


def k_grouped_fp8_gemm_nt_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 128), compiled_dims="mn", use_psum_layout=False
) -> None:
    """SM90's K-major flat form (a deprecated shim on Ascend): group g of ``A`` is a row-major ``[M, k_g]`` block
    of a flat buffer, scales ``[M, sum_k / gran_k]``; transposed and forwarded to the ``_tn`` form."""
    api = "deep_gemm.k_grouped_fp8_gemm_nt_contiguous"
    ck.check_arg(not use_psum_layout, api, "use_psum_layout", "value", "False (the nt form has no psum layout)", True)
    ck.check_arg(ks_cpu is not None, api, "ks_cpu", "value", "the per-group K sizes", None)
    tn = []
    for name, operand, mn in (("a", a, d.shape[1]), ("b", b, d.shape[2])):
        data, sf = _pair(api, name, operand)
        blocks, offset = [], 0
        for k in ks_cpu:
            blocks.append(data.flatten()[offset * mn : (offset + k) * mn].view(mn, k).T)
            offset += k
        tn.append((torch.cat(blocks) if blocks else data.new_empty(0, mn), sf.T))
    k_grouped_fp8_gemm_tn_contiguous(tn[0], tn[1], d, ks_cpu, grouped_layout, c, recipe, use_psum_layout=False)


def k_grouped_fp4_gemm_nt_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 32), compiled_dims="mn", use_psum_layout=False
) -> None:
    """DeepGEMM 2.8's FP4 weight gradients ``d[g] = c[g] + Â[:, K_g]·B̂[:, K_g]^T`` (specs/upstream_2609.md §4):
    ``a = (int8 [M, ΣK/2], sf)`` and ``b = (int8 [N, ΣK/2], sf)``, packed E2M1 along K (K-major), UE8M0 scales per
    32 given K first as upstream's generators lay them out (FP32 or E8M0 ``[ΣK/32, MN]``, or int32 packing four K
    blocks to a word ``[ΣK/128, MN]``), ``recipe = (1, 1, 32)``, ``d [G, M, N]``, ``c`` optional. Groups: per-group
    sizes ``ks_cpu`` (multiples of 256, upstream's K alignment) or, with ``use_psum_layout``, the psum ends in
    ``grouped_layout``. Each E2M1 value is an E4M3 value, so the operands are re-encoded exactly and run
    ``k_grouped_fp8_gemm`` with 32-row scale blocks."""
    api = "deep_gemm.k_grouped_fp4_gemm_nt_contiguous"
    ck.check_arg(tuple(recipe) == (1, 1, 32), api, "recipe", "value", "(1, 1, 32)", tuple(recipe))
    if not use_psum_layout:
        ck.check_arg(ks_cpu is not None, api, "ks_cpu", "value", "the per-group K sizes", None)
        ks = [int(k) for k in ks_cpu]
        bad = [k for k in ks if k % 256]
        ck.check_arg(not bad, api, "ks_cpu", "values", "multiples of 256 (upstream's K alignment)", bad)
    tn = []
    for name, operand, mn in (("a", a, d.shape[1]), ("b", b, d.shape[2])):
        data, sf = _pair(api, name, operand)
        ck.check_arg(
            data.dtype in (torch.int8, torch.uint8, torch.float4_e2m1fn_x2),
            api,
            name,
            "dtype",
            "torch.int8 (packed E2M1)",
            data.dtype,
        )
        total = data.shape[1] * 2 if data.dim() == 2 else 0
        ck.check_arg(
            data.dim() == 2 and data.shape[0] == mn and data.is_contiguous(),
            api,
            name,
            "shape",
            f"[{mn}, ΣK/2] (packed, K-major, contiguous)",
            lambda data=data: ck.shape_str(data.shape),
        )
        scales = scales_to_float(sf.T.contiguous()).T  # K first; int32 packs four K blocks to a word
        ck.check_arg(
            scales.shape == (total // 32, mn),
            api,
            f"sf{name}",
            "shape",
            f"[{total // 32}, {mn}] scales (or [{total // 128}, {mn}] packed int32), K first",
            lambda sf=sf: ck.shape_str(sf.shape),
        )
        values = decode_e2m1(unpack_e2m1(data)).to(torch.float8_e4m3fn)  # exact: E2M1 values are E4M3 values
        tn.append((values.t().contiguous(), scales.contiguous()))
    k_grouped_fp8_gemm_tn_contiguous(
        tn[0], tn[1], d, ks_cpu, grouped_layout, c, (1, 1, 32), use_psum_layout=use_psum_layout
    )


m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp8_gemm_nn_contiguous = m_grouped_fp8_fp4_gemm_nn_contiguous
m_grouped_fp8_gemm_nt_masked = fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked
