"""The grouped family: MoE grouped GEMMs over expert segments (m-grouped contiguous and masked, k-grouped).

Layouts: ``psum=True`` takes int32 cumulative group ends ``[G]`` (``torch._grouped_mm``'s ``offs``; group g
spans rows ``[align(end[g-1], alignment), end[g])``), ``psum=False`` one int32 group id per row (``-1`` =
padding). Rows outside every group are zeros in the output. Operands as in the gemm family (BF16 in
production; FP16/FP32/FP64 accepted), accumulation in FP32 and one rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_m_grouped = torch.ops.ascend_moe.m_grouped_bf16_gemm.default
_masked = torch.ops.ascend_moe.m_grouped_bf16_gemm_masked.default
_k_grouped = torch.ops.ascend_moe.k_grouped_bf16_gemm.default
_m_grouped_fp8 = torch.ops.ascend_moe.m_grouped_fp8_gemm.default
_masked_fp8 = torch.ops.ascend_moe.m_grouped_fp8_gemm_masked.default
_linear_fp8 = torch.ops.ascend_moe.m_grouped_fp8_linear.default
_quant_fp8 = torch.ops.ascend_moe.m_grouped_fp8_quant_gemm.default
_k_grouped_fp8 = torch.ops.ascend_moe.k_grouped_fp8_gemm.default
_swiglu = torch.ops.ascend_moe.m_grouped_bf16_gemm_swiglu.default
_swiglu_fp8 = torch.ops.ascend_moe.m_grouped_fp8_gemm_swiglu.default


@schema_defaults
def m_grouped_bf16_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    layout: torch.Tensor,
    *,
    psum: bool = FROM_SCHEMA,
    alignment: int = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``D[i] = A[i] @ B[g(i)]^T``: tokens ``a[M, K]`` sorted by expert, expert weights ``b[G, N, K]``.

    >>> a, b = torch.randn(5, 8), torch.randn(2, 3, 8)
    >>> m_grouped_bf16_gemm(a, b, torch.tensor([2, 5], dtype=torch.int32)).shape  # rows 0-1: expert 0
    torch.Size([5, 3])
    """
    return _m_grouped(a, b, layout, psum, alignment, out_dtype)


@schema_defaults
def m_grouped_bf16_gemm_swiglu(
    a: torch.Tensor,
    b: torch.Tensor,
    layout: torch.Tensor,
    *,
    psum: bool = FROM_SCHEMA,
    alignment: int = FROM_SCHEMA,
    row_weights: torch.Tensor | None = None,
    activation_clamp: float | None = None,
    quant_gran_k: int = FROM_SCHEMA,
    use_ue8m0: bool = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The experts' first GEMM and SwiGLU in one op, without the ``[M, 2I]`` intermediate: ``(out [M, I], scales)``.

    ``h = m_grouped_bf16_gemm(a, b, layout)`` (``b [G, 2I, K]``: gate rows, then up rows; rounded to ``a``'s dtype),
    ``gate, up = h.chunk(2, -1)``, optionally ``gate <= activation_clamp`` and ``|up| <= activation_clamp``, then
    ``act = silu(gate) * up (* row_weights[:, None])`` in FP32 (FP64 for FP64 operands) and one rounding to
    ``out_dtype`` (default ``a``'s), or, with ``quant_gran_k > 0``, FP8 E4M3 with FP32 scales per 1 x
    ``quant_gran_k`` (``use_ue8m0``: powers of two), ready for an FP8 grouped GEMM (``per_token_cast_to_fp8``'s
    rule). Without quantization ``scales`` is ``[M, 0]``. Rows no group owns get the epilogue of a zero ``h``.
    Differentiable in ``a``, ``b`` and ``row_weights`` (the backward recomputes ``h``); the FP8 output is not.

    >>> a, b = torch.randn(5, 8), torch.randn(2, 6, 8)
    >>> out, _ = m_grouped_bf16_gemm_swiglu(a, b, torch.tensor([2, 5], dtype=torch.int32))
    >>> out.shape
    torch.Size([5, 3])
    """
    return _swiglu(a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype)


def m_grouped_bf16_gemm_masked(
    a: torch.Tensor, b: torch.Tensor, masked_m: torch.Tensor, *, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``D[g, i] = A[g, i] @ B[g]^T`` for ``i < masked_m[g]`` (``a[G, M_max, K]``); other rows are zeros
    and the rows of ``a`` beyond ``masked_m[g]`` are never read."""
    return _masked(a, b, masked_m, out_dtype)


@schema_defaults
def k_grouped_bf16_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    layout: torch.Tensor,
    num_groups: int,
    c: torch.Tensor | None = None,
    *,
    psum: bool = FROM_SCHEMA,
    alignment: int = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``D[g] = C[g] + sum over rows s of group g of A[s]^T B[s]``: ``a[S, M]``, ``b[S, N]`` -> ``D[G, M, N]``.

    This is an expert weight gradient: ``a`` = output gradients, ``b`` = inputs, rows grouped by expert.
    """
    return _k_grouped(a, b, layout, num_groups, psum, alignment, c, out_dtype)


@schema_defaults
def m_grouped_fp8_gemm(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    layout: torch.Tensor,
    *,
    psum: bool = FROM_SCHEMA,
    alignment: int = FROM_SCHEMA,
    recipe_a: Sequence[int] = FROM_SCHEMA,
    recipe_b: Sequence[int] = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Scaled ``m_grouped_bf16_gemm``: FP8 (or packed FP4) ``a[M, K]`` with per-row scales ``sfa[M, K/gk]``,
    expert weights ``b[G, N, K]`` with ``sfb[G, ceil(N/gn), K/gk]`` (formats as ``fp8_gemm``)."""
    return _m_grouped_fp8(a, sfa, b, sfb, layout, psum, alignment, list(recipe_a), list(recipe_b), out_dtype)


@schema_defaults
def m_grouped_fp8_gemm_swiglu(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    layout: torch.Tensor,
    *,
    psum: bool = FROM_SCHEMA,
    alignment: int = FROM_SCHEMA,
    recipe_a: Sequence[int] = FROM_SCHEMA,
    recipe_b: Sequence[int] = FROM_SCHEMA,
    row_weights: torch.Tensor | None = None,
    activation_clamp: float | None = None,
    quant_gran_k: int = FROM_SCHEMA,
    use_ue8m0: bool = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``m_grouped_bf16_gemm_swiglu`` with a scaled L1 (FP8 inference experts: DeepSeek-V3's 1x128 x 128x128,
    MegaMoE's FP8 x FP4 1x32): ``h = m_grouped_fp8_gemm(a, sfa, b, sfb, layout)`` rounded to BF16 (``b [G, 2I, K]``:
    gate rows, then up rows), then the same FP32 epilogue (``row_weights`` FP32) and one rounding to ``out_dtype``
    (BF16 by default, or FP32), or with ``quant_gran_k > 0`` FP8 E4M3 with 1 x ``quant_gran_k`` scales ready for the
    L2 ``m_grouped_fp8_gemm``. No ``[M, 2I]`` intermediate. Quantized operands carry no gradient; ``row_weights``
    does (BF16/FP32 output).
    """
    return _swiglu_fp8(
        a, sfa, b, sfb, layout, psum, alignment, list(recipe_a), list(recipe_b), row_weights, activation_clamp,
        quant_gran_k, use_ue8m0, out_dtype,
    )  # fmt: skip


@schema_defaults
def m_grouped_fp8_gemm_masked(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    masked_m: torch.Tensor,
    *,
    recipe_a: Sequence[int] = FROM_SCHEMA,
    recipe_b: Sequence[int] = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Scaled ``m_grouped_bf16_gemm_masked``: ``a[G, M_max, K]`` with ``sfa[G, M_max, K/gk]``."""
    return _masked_fp8(a, sfa, b, sfb, masked_m, list(recipe_a), list(recipe_b), out_dtype)


@schema_defaults
def m_grouped_fp8_quant_gemm(
    x: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    layout: torch.Tensor,
    *,
    psum: bool = FROM_SCHEMA,
    alignment: int = FROM_SCHEMA,
    gran_k: int = FROM_SCHEMA,
    recipe_b: Sequence[int] = FROM_SCHEMA,
    use_ue8m0: bool = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """FP8 inference experts on BF16/FP32 tokens: ``x [M, K]`` cast per token in 1 x ``gran_k`` groups inside the op
    (``quantize_fp8(x, [1, gran_k], use_ue8m0)``'s codes and scales), times the pre-quantized expert weights
    ``(b [G, N, K], sfb)`` as ``m_grouped_fp8_gemm``; output in ``x``'s dtype by default. No FP8 copy of ``x``
    outlives the op. ``x`` gets the straight-through gradient (the exact ``grad @ deq(b[g])`` per row).

    >>> from torch_ascend_moe.quant import per_block_cast_to_fp8
    >>> pairs = [per_block_cast_to_fp8(torch.randn(8, 128), use_ue8m0=False) for _ in range(2)]
    >>> b, sfb = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    >>> x = torch.randn(5, 128, dtype=torch.bfloat16)
    >>> m_grouped_fp8_quant_gemm(x, b, sfb, torch.tensor([2, 5], dtype=torch.int32)).dtype  # rows 0-1: expert 0
    torch.bfloat16
    """
    return _quant_fp8(x, b, sfb, layout, psum, alignment, gran_k, list(recipe_b), use_ue8m0, out_dtype)


@schema_defaults
def m_grouped_fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    layout: torch.Tensor,
    *,
    psum: bool = FROM_SCHEMA,
    alignment: int = FROM_SCHEMA,
    block: int = FROM_SCHEMA,
    use_ue8m0: bool = FROM_SCHEMA,
    fp8_backward: bool = FROM_SCHEMA,
) -> torch.Tensor:
    """FP8 experts for training: ``m_grouped_bf16_gemm`` computed in FP8 with DeepSeek-V3's recipe, BF16/FP32
    ``x`` and ``weight [G, N, K]`` cast inside the op. Straight-through gradients: dgrad in FP8 on the
    requantized gradient (or in the input precision with ``fp8_backward=False``), wgrad in the input precision.
    Any ``K``: the op quantizes whole 1 x ``block`` / ``block`` x ``block`` tiles, so a ragged ``K`` is zero-padded
    to a multiple of ``block`` here (exact: zeros change neither the products nor the tiles' scales).
    """
    pad = -x.shape[-1] % block if block > 0 else 0
    if pad:
        x, weight = torch.nn.functional.pad(x, (0, pad)), torch.nn.functional.pad(weight, (0, pad))
    return _linear_fp8(x, weight, layout, psum, alignment, block, use_ue8m0, fp8_backward)


@schema_defaults
def k_grouped_fp8_gemm(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    layout: torch.Tensor,
    num_groups: int,
    c: torch.Tensor | None = None,
    *,
    alignment: int = FROM_SCHEMA,
    gran_k: int = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """FP8 weight gradients ``D[g] = C[g] + deq(A)[rows_g]^T deq(B)[rows_g]`` over a psum layout.

    ``a[S, M]``, ``b[S, N]`` FP8 E4M3 with per-channel scales along ``S``: each group contributes
    ``ceil(k_g / gran_k)`` consecutive scale rows (``sfa[S', M]``, ``sfb[S', N]``) computed over its own rows.
    Output FP32 unless ``out_dtype``/``c`` say BF16.
    """
    return _k_grouped_fp8(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype)
