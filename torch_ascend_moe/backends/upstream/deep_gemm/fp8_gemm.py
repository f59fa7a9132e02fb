"""``fp8_gemm`` on DeepGEMM's ``fp8_fp4_gemm_nt`` (CUDA) and DeepGEMM-Ascend's (Ascend 950).

CUDA, what it takes (deepgemm_api.md §2.3-§2.8, §3.1; DeepGEMM 2.6.1 ``csrc/apis/gemm.hpp`` and its SM90/SM100
kernels' host checks):

* SM90: FP8 x FP8, both K-major, FP32 scales kept FP32 (``disable_ue8m0_cast``, as upstream's tests on SM90);
  1x128 x 128x128 to BF16 without ``c`` (the "1D2D" kernel; N a multiple of 8, its device assert) or 1x128 x 1x128
  to FP32 (the "1D1D" kernel, which accumulates: ``c``, or zeros, in ``d``; rows of A and B contiguous: it builds its
  descriptors with stride K);
* SM100: FP8 or packed FP4 (K a multiple of 128 for FP4: its TMA rule), UE8M0 scales (our E8M0 tensors; FP32 ones
  would be reduced to their exponent), ``gran_k`` 32 or 128, BF16 or FP32 out, with or without ``c``;
* ``alpha`` 1 only (the CUDA build has no alpha argument in 2.6; 2.8's runtime alpha is not pinned here).

Ascend (deepgemm_api.md §16.2, DeepGEMM-Ascend ``csrc/apis/gemm.hpp``): FP8 x FP8, FP4 x FP4 (K-major), FP8 x FP4;
``gran_k`` 32 on both operands and ``gran_mn`` a power of two up to 128; UE8M0 scales only (FP32 ones with a
mantissa "panic"); BF16 or FP32 out; ``c`` copied into ``d`` and passed as ``d`` (its only accumulation form);
``alpha`` passed through.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.upstream.deep_gemm import (
    ASCEND,
    CUDA,
    SM90,
    accumulator,
    alpha_epilogue,
    as_library_fp4,
    cuda_arch,
    cuda_refusal,
    real_refusal,
    scale_refusal,
    scales_as_fp32,
    tma_refusal,
)
from torch_ascend_moe.checks.fp8_gemm import (
    einsum_plan,
    fp8_bmm_signature,
    fp8_einsum_signature,
    fp8_gemm_signature,
    is_fp4,
    logical_k,
)

_FP8 = torch.float8_e4m3fn


def _common_refusal(a, sfa, b, sfb, c, dtype) -> str | None:
    m, n, k = a.shape[0], b.shape[0], logical_k(a)
    if not (m and n and k):
        return "empty operands: nothing to hand the library"
    d_row = "N not a multiple of 16 bytes of output (TMA)" if (n * dtype.itemsize) % 16 else None
    return real_refusal(a, sfa, b, sfb, c) or d_row or tma_refusal(a=a, b=b)


def cuda_refusal_of(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, dtype) -> str | None:
    """Why DeepGEMM's CUDA ``fp8_fp4_gemm_nt`` does not take a validated ``fp8_gemm`` call, or None."""
    why = _common_refusal(a, sfa, b, sfb, c, dtype) or cuda_refusal()
    if why:
        return why
    if alpha != 1.0:
        return "alpha != 1 (the CUDA build takes no alpha)"
    ra, rb = list(recipe_a), list(recipe_b)
    if cuda_arch() == SM90:
        if a.dtype != _FP8 or b.dtype != _FP8:
            return "packed FP4 on SM90 (FP4 kernels are SM100's)"
        if a.stride(-1) != 1 or b.stride(-1) != 1:
            return "an MN-major operand (SM90's FP8 kernels take K-major A and B)"
        if ra == [1, 128] and rb == [128, 128]:
            if c is not None or dtype != torch.bfloat16:
                return "1x128 x 128x128 on SM90 gives BF16 without c only (the 1D2D kernel)"
            return None if b.shape[0] % 8 == 0 else "N not a multiple of 8 (the SM90 1D2D kernel's device assert)"
        if ra == [1, 128] and rb == [1, 128]:
            if dtype != torch.float32:
                return "1x128 x 1x128 on SM90 gives FP32 only (the 1D1D kernel)"
            rows = a.stride(0) == a.shape[1] and b.stride(0) == b.shape[1]
            return None if rows else "rows of A or B not contiguous (the 1D1D kernel's descriptors use stride K)"
        return f"recipes {ra} x {rb}: SM90 has 1x128 x 128x128 and 1x128 x 1x128 only"
    why = scale_refusal(sfa, sfb, library_keeps_fp32=False)
    if why:
        return why
    if ra[1] not in (32, 128) or rb[1] not in (32, 128):
        return f"gran_k {ra[1]} / {rb[1]}: SM100 takes 32 or 128"
    fp4_k = any(is_fp4(t) for t in (a, b)) and logical_k(a) % 128
    return "packed FP4 with K not a multiple of 128 (its TMA rule)" if fp4_k else None


def _takes_cuda(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    _, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    return first_refusal(cuda_refusal_of(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, dtype))


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.fp8_fp4_gemm_nt",
    takes=_takes_cuda,
    available=CUDA.available,
)
def fp8_gemm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    dg = CUDA.module()
    sm90 = cuda_arch() == SM90
    d = accumulator(shape, dtype, c, a.device)
    if c is None and sm90 and list(recipe_b) == [1, 128]:
        d.zero_()  # the 1D1D kernel accumulates into c: zeros, passed as d itself
    c = d if c is not None or (sm90 and list(recipe_b) == [1, 128]) else None
    gemm = getattr(dg, "fp8_fp4_gemm_nt", None) or dg.fp8_gemm_nt
    gemm(
        (as_library_fp4(a), scales_as_fp32(sfa)),
        (as_library_fp4(b), scales_as_fp32(sfb)),
        d,
        c=c,
        recipe_a=tuple(recipe_a),
        recipe_b=tuple(recipe_b),
        disable_ue8m0_cast=sm90,
    )
    return d


def ascend_refusal_of(a, sfa, b, sfb, c, recipe_a, recipe_b, dtype) -> str | None:
    """Why DeepGEMM-Ascend's ``fp8_fp4_gemm_nt`` does not take a validated ``fp8_gemm`` call, or None."""
    why = _common_refusal(a, sfa, b, sfb, c, dtype) or scale_refusal(sfa, sfb, library_keeps_fp32=False)
    if why:
        return why
    (gm_a, gk_a), (gm_b, gk_b) = recipe_a, recipe_b
    if gk_a != 32 or gk_b != 32:
        return f"gran_k {gk_a} / {gk_b}: DeepGEMM-Ascend takes 32 only"
    if any(g < 1 or g > 128 or g & (g - 1) for g in (gm_a, gm_b)):
        return f"gran_mn {gm_a} / {gm_b}: DeepGEMM-Ascend takes a power of two up to 128"
    if any(t.stride(-1) == 1 and t.stride(-2) == 1 for t in (a, b)):
        return "an operand whose last two strides are both 1 (its major axis is ambiguous to the library)"
    return None


def _takes_ascend(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    _, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    return first_refusal(ascend_refusal_of(a, sfa, b, sfb, c, recipe_a, recipe_b, dtype))


@kernel(
    "fp8_gemm",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.fp8_fp4_gemm_nt (Ascend)",
    takes=_takes_ascend,
    available=ASCEND.available,
)
def fp8_gemm_ascend(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    d = accumulator(shape, dtype, c, a.device)
    ASCEND.module().fp8_fp4_gemm_nt(
        (as_library_fp4(a), scales_as_fp32(sfa)),
        (as_library_fp4(b), scales_as_fp32(sfb)),
        d,
        c=None if c is None else d,
        recipe_a=tuple(recipe_a),
        recipe_b=tuple(recipe_b),
        alpha=alpha,
    )
    return d


def _batched_ascend_refusal(a, sfa, b, sfb, recipe_a, recipe_b, dtype, what: str) -> str | None:
    """DeepGEMM-Ascend's FP8 batched GEMM (``fp8_bmm``, also under its einsums) on ``[batch, mn, k]`` operand views:
    FP8 x FP8, each batch by ``fp8_gemm``'s rules, then the batched strides."""
    if a.dtype != _FP8 or b.dtype != _FP8:
        return f"packed FP4 (DeepGEMM-Ascend's {what} is FP8 x FP8)"
    return ascend_refusal_of(a[0], sfa[0], b[0], sfb[0], None, recipe_a, recipe_b, dtype) or tma_refusal(a=a, b=b)


def _takes_bmm_ascend(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    _, dtype = fp8_bmm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    if not a.shape[0]:
        return first_refusal("an empty batch: nothing to hand the library")
    return first_refusal(_batched_ascend_refusal(a, sfa, b, sfb, recipe_a, recipe_b, dtype, "bmm"))


@kernel(
    "fp8_bmm",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.fp8_bmm (Ascend)",
    takes=_takes_bmm_ascend,
    available=ASCEND.available,
)
def fp8_bmm_ascend(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_bmm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    d = accumulator(shape, dtype, c, a.device)
    dg = ASCEND.module()
    dg.fp8_bmm(
        (a, scales_as_fp32(sfa)),
        (b, scales_as_fp32(sfb)),
        d,
        c=None if c is None else d,
        recipe=(recipe_a[0], recipe_b[0], recipe_a[1]),
        epilogue=alpha_epilogue(dg, alpha),
    )
    return d


# DeepGEMM's FP8 einsums (2.6.1 ``csrc/apis/einsum.hpp`` 137-212): a batched FP8 GEMM over permuted views; SM90 has
# the first only, with the 1D2D kernel's rules.
_EINSUM_ARCH = {"bhr,hdr->bhd": (9, 10), "bhd,hdr->bhr": (10,), "bhd,bhr->hdr": (10,)}


def _takes_einsum_cuda(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_einsum_signature(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    why = "alpha != 1 (the CUDA build takes no alpha)" if alpha != 1.0 else None
    why = why or ("empty operands: nothing to hand the library" if not (a.numel() and b.numel()) else None)
    why = why or cuda_refusal() or real_refusal(a, sfa, b, sfb, c)
    if why:
        return first_refusal(why)
    arch = cuda_arch()
    if arch not in _EINSUM_ARCH[equation]:
        return first_refusal(
            f"'{equation}' on SM{arch}x (its kernels: SM{', SM'.join(map(str, _EINSUM_ARCH[equation]))})"
        )
    _, _, _, perm_a, perm_b, _ = einsum_plan(equation)
    va, vb = a.permute(perm_a), b.permute(perm_b)
    if (va.stride(-1) != 1 and va.stride(-2) != 1) or (vb.stride(-1) != 1 and vb.stride(-2) != 1):
        return first_refusal("an operand with no unit stride in its GEMM view")
    if recipe_a[1] != recipe_b[1]:
        return first_refusal("the operands' gran_k differ (one recipe upstream)")
    if arch == SM90:
        if list(recipe_a) != [1, 128] or list(recipe_b) != [128, 128] or c is not None or dtype != torch.bfloat16:
            return first_refusal("SM90: 1x128 x 128x128 to BF16 without c only (the 1D2D kernel)")
        if va.stride(-1) != 1 or vb.stride(-1) != 1 or vb.shape[1] % 8:
            return first_refusal("SM90: K-major views and N a multiple of 8 (the 1D2D kernel)")
    else:
        why = scale_refusal(sfa, sfb, library_keeps_fp32=False)
        if why or recipe_a[1] not in (32, 128) or recipe_a[0] != 1:
            return first_refusal(why or f"recipes {list(recipe_a)} x {list(recipe_b)}: SM100 takes 1 x 32/128 for a")
        if equation == "bhd,bhr->hdr" and dtype != torch.float32:
            return first_refusal("bhd,bhr->hdr gives FP32 only (it accumulates in place)")
    if (shape[-1] * dtype.itemsize) % 16:
        return first_refusal("the output's rows not 16-byte aligned (TMA)")
    return first_refusal(tma_refusal(a=va, b=vb))


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.fp8_einsum",
    takes=_takes_einsum_cuda,
    available=CUDA.available,
)
def fp8_einsum(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_einsum_signature(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    accumulate = equation == "bhd,bhr->hdr"
    d = accumulator(shape, dtype, c, a.device)
    if accumulate and c is None:
        d.zero_()
    CUDA.module().fp8_einsum(
        equation,
        (a, scales_as_fp32(sfa)),
        (b, scales_as_fp32(sfb)),
        d,
        c=d if accumulate or c is not None else None,
        recipe=(recipe_a[0], recipe_b[0], recipe_a[1]),
    )
    return d


def _takes_einsum_ascend(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    """DeepGEMM-Ascend's ``fp8_einsum`` (``csrc/apis/einsum.hpp``): its ``fp8_bmm`` on the three equations' permuted
    views and scales (FP8 x FP8, UE8M0 gran_k 32, ``alpha`` as its Alpha epilogue, ``c`` accumulated in place)."""
    _, dtype = fp8_einsum_signature(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    if not (a.numel() and b.numel()):
        return first_refusal("empty operands: nothing to hand the library")
    _, _, _, perm_a, perm_b, _ = einsum_plan(equation)
    views = a.permute(perm_a), sfa.permute(perm_a), b.permute(perm_b), sfb.permute(perm_b)
    return first_refusal(_batched_ascend_refusal(*views, recipe_a, recipe_b, dtype, "einsum"))


@kernel(
    "fp8_einsum",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.fp8_einsum (Ascend)",
    takes=_takes_einsum_ascend,
    available=ASCEND.available,
)
def fp8_einsum_ascend(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    shape, dtype = fp8_einsum_signature(equation, a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    d = accumulator(shape, dtype, c, a.device)
    dg = ASCEND.module()
    dg.fp8_einsum(
        equation,
        (a, scales_as_fp32(sfa)),
        (b, scales_as_fp32(sfb)),
        d,
        c=None if c is None else d,
        recipe=(recipe_a[0], recipe_b[0], recipe_a[1]),
        epilogue=alpha_epilogue(dg, alpha),
    )
    return d
