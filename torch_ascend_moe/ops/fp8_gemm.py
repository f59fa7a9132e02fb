"""The fp8_gemm family: block-scaled FP8 / FP4 GEMMs with FP32 accumulation."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_fp8_gemm = torch.ops.ascend_moe.fp8_gemm.default
_fp8_bmm = torch.ops.ascend_moe.fp8_bmm.default
_fp8_einsum = torch.ops.ascend_moe.fp8_einsum.default


@schema_defaults
def fp8_gemm(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    recipe_a: Sequence[int] = FROM_SCHEMA,
    recipe_b: Sequence[int] = FROM_SCHEMA,
    alpha: float = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``D = alpha * deq(A) @ deq(B)^T + C`` with ``deq(X)[r, k] = X[r, k] * sf[r // gran_mn, k // gran_k]``.

    ``a``/``b`` are ``float8_e4m3fn`` ``[MN, K]`` (any majorness) or packed FP4 ``uint8 [MN, K/2]``
    (K-major; FP4 A needs FP4 B). Scales are FP32 or ``float8_e8m0fnu`` of shape
    ``[ceil(MN / gran_mn), K / gran_k]``; ``recipe_*`` is ``(gran_mn, gran_k)`` (default: DeepSeek-V3's
    1x128 activations, 128x128 weight blocks). Output BF16 unless ``out_dtype``/``c`` say FP32.

    >>> from torch_ascend_moe.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
    >>> a, sfa = per_token_cast_to_fp8(torch.randn(4, 256), use_ue8m0=False)
    >>> b, sfb = per_block_cast_to_fp8(torch.randn(8, 256), use_ue8m0=False)
    >>> fp8_gemm(a, sfa, b, sfb).shape
    torch.Size([4, 8])
    """
    return _fp8_gemm(a, sfa, b, sfb, c, list(recipe_a), list(recipe_b), alpha, out_dtype)


@schema_defaults
def fp8_bmm(
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    recipe_a: Sequence[int] = FROM_SCHEMA,
    recipe_b: Sequence[int] = FROM_SCHEMA,
    alpha: float = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Batched ``fp8_gemm``: ``D[g] = alpha * deq(A[g]) @ deq(B[g])^T + C[g]``.

    ``a`` is ``[G, M, K]``, ``b`` ``[G, N, K]`` (FP8, or packed FP4 ``uint8`` with K halved), scales
    ``[G, ceil(MN / gran_mn), K / gran_k]``; everything else as ``fp8_gemm``.
    """
    return _fp8_bmm(a, sfa, b, sfb, c, list(recipe_a), list(recipe_b), alpha, out_dtype)


@schema_defaults
def fp8_einsum(
    equation: str,
    a: torch.Tensor,
    sfa: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    recipe_a: Sequence[int] = FROM_SCHEMA,
    recipe_b: Sequence[int] = FROM_SCHEMA,
    alpha: float = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """DeepGEMM's ``fp8_einsum`` equations on FP8 operands: ``'bhr,hdr->bhd'``, ``'bhd,hdr->bhr'``, ``'bhd,bhr->hdr'``.

    Each is a batched GEMM over ``h``. A scale tensor keeps its operand's subscripts: ``h`` whole, the
    operand's output letter divided by ``gran_mn`` (rounded up) and the contracted letter by ``gran_k``.
    DeepSeek's uses: ``'bhr,hdr->bhd'`` with per-token ``sfa[B, H, R/128]`` and block ``sfb[H, D/128,
    R/128]``; ``'bhd,bhr->hdr'`` (a weight gradient over tokens) with ``recipe_a = recipe_b = (1, 128)``,
    i.e. ``sfa[B/128, H, D]``, ``sfb[B/128, H, R]``.
    """
    return _fp8_einsum(equation, a, sfa, b, sfb, c, list(recipe_a), list(recipe_b), alpha, out_dtype)
