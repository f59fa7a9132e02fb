"""DeepGEMM(-Ascend)'s block-scaled dense GEMMs: ``fp8_fp4_gemm_{nt,nn,tn,tt}`` and the ``fp8_gemm_*`` aliases.

Operands are ``(data, scale factors)`` tuples as upstream (specs/deepgemm_api.md §2.3, §3.1, §16.2):
data FP8 E4M3, or packed FP4 as ``int8`` (upstream), ``uint8`` or ``float4_e2m1fn_x2`` (Ascend tests);
scales FP32, ``float8_e8m0fnu``, UE8M0 packed 4 per ``int32`` (upstream) or 2 per ``int16`` (Ascend).
The layout letters transpose data and scales together, as upstream's wrappers do; a transposed packed
FP4 operand is repacked along K. The math is ``ascend_moe::fp8_gemm``.

FP32 scales are used verbatim whatever ``disable_ue8m0_cast`` says: that is upstream's SM90 behaviour
and exact; SM100 would round them up to powers of two (a no-op for the UE8M0 scales its tests use).
"""

from __future__ import annotations

import torch

from torch_ascend_moe import _checks as ck
from torch_ascend_moe.deep_gemm.epilogue import resolve_alpha
from torch_ascend_moe.deep_gemm.gemm import _check_out
from torch_ascend_moe.ops.fp8_gemm import fp8_gemm as _fp8_gemm_op
from torch_ascend_moe.quant import scales_to_float, transpose_packed_fp4

_FP4_DTYPES = (torch.int8, torch.uint8, torch.float4_e2m1fn_x2)


def _pair(api: str, name: str, operand) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(operand, (tuple, list)) and len(operand) == 2):
        raise TypeError(
            f"{api}: argument '{name}': expected a (data, scale factors) tuple, got {type(operand).__name__}"
        )
    return operand[0], operand[1]


def _logical(data: torch.Tensor, sf: torch.Tensor, transposed: bool, k_blocks: int | None = None):
    """``(data [MN, K] or packed [MN, K/2] uint8, FP32/e8m0 scales [MN-blocks, K-blocks])`` of one operand."""
    fp4 = data.dtype in _FP4_DTYPES
    if fp4:
        data = data.view(torch.uint8)
    if transposed:
        data = transpose_packed_fp4(data).view(torch.uint8) if fp4 else data.mT
        sf = sf.mT
    if sf.dtype in (torch.int32, torch.int16):
        sf = scales_to_float(sf)  # packed along K: unpacking may leave padding entries at the end
        if k_blocks is not None:
            sf = sf[..., :k_blocks]
    return data, sf


def _resolve_recipes(api: str, recipe, recipe_a, recipe_b, sfb: torch.Tensor):
    if recipe is not None:
        ck.check_arg(
            recipe_a is None and recipe_b is None,
            api,
            "recipe",
            "value",
            "None when recipe_a/recipe_b are given",
            tuple(recipe),
        )
        ck.check_arg(len(recipe) == 3, api, "recipe", "value", "(gran_m, gran_n, gran_k)", tuple(recipe))
        return [recipe[0], recipe[2]], [recipe[1], recipe[2]]
    ck.check_arg(
        (recipe_a is None) == (recipe_b is None),
        api,
        "recipe_b" if recipe_b is None else "recipe_a",
        "value",
        "given together with the other per-operand recipe",
        None,
    )
    if recipe_a is not None:
        return list(recipe_a), list(recipe_b)
    # Upstream's default: FP32 weight scales mean 128x128 blocks; packed UE8M0 ones mean 1x128 rows.
    return ([1, 128], [128, 128]) if sfb.dtype == torch.float32 else ([1, 128], [1, 128])


def _scaled_gemm(api, a, b, d, c, recipe, recipe_a, recipe_b, alpha, epilogue, a_t=False, b_t=False) -> None:
    a_data, sfa = _pair(api, "a", a)
    b_data, sfb = _pair(api, "b", b)
    ra, rb = _resolve_recipes(api, recipe, recipe_a, recipe_b, sfb)
    k = (a_data.shape[0] if a_t else a_data.shape[1]) * (2 if a_data.dtype in _FP4_DTYPES and not a_t else 1)
    a_data, sfa = _logical(a_data, sfa, a_t, -(-k // ra[1]))
    b_data, sfb = _logical(b_data, sfb, b_t, -(-k // rb[1]))
    _check_out(api, d, c, [a_data.shape[0], b_data.shape[0]])
    scale = resolve_alpha(api, alpha, epilogue)
    if d.numel() == 0:
        return
    d.copy_(_fp8_gemm_op(a_data, sfa, b_data, sfb, c, recipe_a=ra, recipe_b=rb, alpha=scale, out_dtype=d.dtype))


def fp8_fp4_gemm_nt(
    a,
    b,
    d,
    c=None,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    compiled_dims="nk",
    disable_ue8m0_cast=False,
    alpha=None,
    epilogue=None,
) -> None:
    """``d = alpha * deq(A) @ deq(B)^T (+ c)``: ``a = (A[M, K], sfa)``, ``b = (B[N, K], sfb)``."""
    _scaled_gemm("deep_gemm.fp8_fp4_gemm_nt", a, b, d, c, recipe, recipe_a, recipe_b, alpha, epilogue)


def fp8_fp4_gemm_nn(
    a,
    b,
    d,
    c=None,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    compiled_dims="nk",
    disable_ue8m0_cast=False,
    alpha=None,
    epilogue=None,
) -> None:
    """As ``_nt`` with ``b = (B[K, N], sfb[K-blocks, N-blocks])``."""
    _scaled_gemm("deep_gemm.fp8_fp4_gemm_nn", a, b, d, c, recipe, recipe_a, recipe_b, alpha, epilogue, b_t=True)


def fp8_fp4_gemm_tn(
    a,
    b,
    d,
    c=None,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    compiled_dims="mn",
    disable_ue8m0_cast=False,
    alpha=None,
    epilogue=None,
) -> None:
    """As ``_nt`` with ``a = (A[K, M], sfa[K-blocks, M-blocks])`` and ``b = (B[K, N], ...)``."""
    _scaled_gemm("deep_gemm.fp8_fp4_gemm_tn", a, b, d, c, recipe, recipe_a, recipe_b, alpha, epilogue, True, True)


def fp8_fp4_gemm_tt(
    a,
    b,
    d,
    c=None,
    recipe=None,
    recipe_a=None,
    recipe_b=None,
    compiled_dims="mn",
    disable_ue8m0_cast=False,
    alpha=None,
    epilogue=None,
) -> None:
    """As ``_nt`` with ``a = (A[K, M], sfa[K-blocks, M-blocks])``."""
    _scaled_gemm("deep_gemm.fp8_fp4_gemm_tt", a, b, d, c, recipe, recipe_a, recipe_b, alpha, epilogue, a_t=True)


fp8_gemm_nt, fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt = fp8_fp4_gemm_nt, fp8_fp4_gemm_nn, fp8_fp4_gemm_tn, fp8_fp4_gemm_tt
