"""DeepGEMM(-Ascend)'s dense BF16 entry points: out-parameter wrappers over the gemm-family ops.

Semantics follow upstream (specs/deepgemm_api.md §2.4-2.5, §3.2-3.3, §7, §16.2): ``D`` and ``C`` are
row-major, ``C`` may be ``D`` itself (in-place accumulation), ``M == 0`` or ``N == 0`` writes nothing,
``K == 0`` writes ``C`` (or zeros). The suffix letters say how A and B are given: ``nt`` = ``A[M,K]``,
``B[N,K]``; ``nn`` = ``B[K,N]``; ``tn`` = ``A[K,M]``; ``tt`` = both transposed. All math is in the ops.
``compiled_dims`` only tunes JIT kernels upstream; it is accepted and has no effect here.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.checks.gemm import einsum_signature
from torch_ascend_moe.deep_gemm.epilogue import resolve_alpha
from torch_ascend_moe.ops.fp8_gemm import fp8_gemm as _fp8_gemm_op
from torch_ascend_moe.ops.gemm import bf16_bmm as _bmm_op
from torch_ascend_moe.ops.gemm import bf16_einsum as _einsum_op
from torch_ascend_moe.ops.gemm import bf16_gemm as _gemm_op
from torch_ascend_moe.quant import decode_e2m1, unpack_e2m1

_OUT_DTYPES = (torch.bfloat16, torch.float32)
_OUT_DTYPES_TEXT = "torch.bfloat16 or torch.float32"


def _check_dtype(api: str, name: str, t: torch.Tensor, allowed: tuple, text: str) -> None:
    ck.check_arg(t.dtype in allowed, api, name, "dtype", text, t.dtype)


def _check_major(api: str, name: str, t: torch.Tensor) -> None:
    # Upstream reads majorness from strides: one of the last two must be unit (K-major or MN-major).
    ck.check_arg(
        t.stride(-1) == 1 or t.stride(-2) == 1,
        api,
        name,
        "strides",
        "stride(-1) == 1 (K-major) or stride(-2) == 1 (MN-major)",
        list(t.stride()),
    )


def _check_out(api: str, d: torch.Tensor, c: torch.Tensor | None, shape: list) -> None:
    _check_dtype(api, "d", d, _OUT_DTYPES, _OUT_DTYPES_TEXT)
    ck.check_arg(
        list(d.shape) == list(shape), api, "d", "shape", lambda: ck.shape_str(shape), lambda: ck.shape_str(d.shape)
    )
    ck.check_arg(d.stride(-1) == 1, api, "d", "stride(-1)", "1 (row-major output)", lambda: d.stride(-1))
    if c is None:
        return
    ck.check_arg(c.dtype == d.dtype, api, "c", "dtype", lambda: f"{d.dtype} (same as 'd')", c.dtype)
    ck.check_arg(
        list(c.shape) == list(shape), api, "c", "shape", lambda: ck.shape_str(shape), lambda: ck.shape_str(c.shape)
    )
    ck.check_arg(c.stride(-1) == 1, api, "c", "stride(-1)", "1 (row-major accumulator)", lambda: c.stride(-1))
    if c is not d and torch._C._is_alias_of(c, d):
        # Upstream allows C to share D's memory only as the very same view (in-place accumulation).
        ck.check_arg(
            c.stride() == d.stride() and c.storage_offset() == d.storage_offset(),
            api,
            "c",
            "layout",
            "the same view as 'd' when it shares d's memory",
            f"strides {list(c.stride())}",
        )


def _t(api: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """``t.mT`` of a transposed-layout operand, its rank checked first (``.mT`` of a 1-D tensor names no argument)."""
    ck.check_rank(api, name, t, 2, "matrix")
    return t.mT


def _dense_gemm(api, a, b, d, c, alpha, epilogue, *, operand_dtypes=(torch.bfloat16,)):
    """``d := alpha * a @ b^T + c`` over logical ``a[M,K]``, ``b[N,K]`` (views already transposed)."""
    text = " or ".join(str(t) for t in operand_dtypes)
    for name, t in (("a", a), ("b", b)):
        ck.check_rank(api, name, t, 2, "matrix")
        _check_dtype(api, name, t, operand_dtypes, text)
        _check_major(api, name, t)
    ck.check_dim_size(api, "b", b, 1, "K", a.shape[1], "a's K")
    _check_out(api, d, c, [a.shape[0], b.shape[0]])
    scale = resolve_alpha(api, alpha, epilogue)
    if d.numel() == 0:
        return
    d.copy_(_gemm_op(a, b, c, alpha=scale, out_dtype=d.dtype))


def bf16_gemm_nt(a, b, d, c=None, compiled_dims="nk", alpha=None, epilogue=None) -> None:
    """``d = alpha * a @ b^T (+ c)`` with ``a[M, K]``, ``b[N, K]`` BF16; ``d`` BF16 or FP32 ``[M, N]``."""
    _dense_gemm("deep_gemm.bf16_gemm_nt", a, b, d, c, alpha, epilogue)


def bf16_gemm_nn(a, b, d, c=None, compiled_dims="nk", alpha=None, epilogue=None) -> None:
    """``d = alpha * a @ b (+ c)`` with ``a[M, K]``, ``b[K, N]``."""
    api = "deep_gemm.bf16_gemm_nn"
    _dense_gemm(api, a, _t(api, "b", b), d, c, alpha, epilogue)


def bf16_gemm_tn(a, b, d, c=None, compiled_dims="mn", alpha=None, epilogue=None) -> None:
    """``d = alpha * a^T @ b (+ c)`` with ``a[K, M]``, ``b[K, N]`` (the weight-gradient layout)."""
    api = "deep_gemm.bf16_gemm_tn"
    _dense_gemm(api, _t(api, "a", a), _t(api, "b", b), d, c, alpha, epilogue)


def bf16_gemm_tt(a, b, d, c=None, compiled_dims="mn", alpha=None, epilogue=None) -> None:
    """``d = alpha * a^T @ b^T (+ c)`` with ``a[K, M]``, ``b[N, K]``."""
    api = "deep_gemm.bf16_gemm_tt"
    _dense_gemm(api, _t(api, "a", a), b, d, c, alpha, epilogue)


# cuBLASLt (CUDA) and ACLNN (Ascend) reference GEMMs: same conventions, dtype taken from the tensors.
_BLAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _blas_gemm(api, a, b, d, c):
    if a.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) and b.dtype not in (
        torch.float8_e4m3fn,
        torch.float8_e5m2,
    ):
        _dense_gemm(api, a, b, d, c, None, None, operand_dtypes=_BLAS_DTYPES)
        return
    # Upstream's FP8 tests time cuBLASLt on the raw FP8 data: an unscaled product, i.e. the scaled
    # GEMM op with unit scales (exact: FP8 values times 1, FP32 accumulation).
    for name, t in (("a", a), ("b", b)):
        ck.check_rank(api, name, t, 2, "matrix")
        _check_dtype(api, name, t, (torch.float8_e4m3fn,), "torch.float8_e4m3fn (both operands)")
        _check_major(api, name, t)
    ck.check_dim_size(api, "b", b, 1, "K", a.shape[1], "a's K")
    _check_out(api, d, c, [a.shape[0], b.shape[0]])
    if d.numel() == 0:
        return
    k = a.shape[1]
    if k == 0:  # upstream's early return: d := c, or zeros
        d.copy_(c) if c is not None else d.zero_()
        return
    sfa, sfb = a.new_ones((a.shape[0], 1), dtype=torch.float32), b.new_ones((b.shape[0], 1), dtype=torch.float32)
    d.copy_(_fp8_gemm_op(a, sfa, b, sfb, c, recipe_a=(1, k), recipe_b=(1, k), out_dtype=d.dtype))


def cublaslt_gemm_nt(a, b, d, c=None) -> None:
    """Vendor-BLAS GEMM ``d = a @ b^T (+ c)``; upstream's cuBLASLt baseline. BF16/FP16/FP32 operands, or
    FP8 E4M3 ones multiplied unscaled (as upstream, which hands cuBLASLt the raw FP8 data)."""
    _blas_gemm("deep_gemm.cublaslt_gemm_nt", a, b, d, c)


def cublaslt_gemm_nn(a, b, d, c=None) -> None:
    api = "deep_gemm.cublaslt_gemm_nn"
    _blas_gemm(api, a, _t(api, "b", b), d, c)


def cublaslt_gemm_tn(a, b, d, c=None) -> None:
    api = "deep_gemm.cublaslt_gemm_tn"
    _blas_gemm(api, _t(api, "a", a), _t(api, "b", b), d, c)


def cublaslt_gemm_tt(a, b, d, c=None) -> None:
    api = "deep_gemm.cublaslt_gemm_tt"
    _blas_gemm(api, _t(api, "a", a), b, d, c)


# DeepGEMM-Ascend's names for the ACLNN-backed reference GEMMs.
aclnn_bf16_gemm_nt, aclnn_bf16_gemm_nn = bf16_gemm_nt, bf16_gemm_nn
aclnn_bf16_gemm_tn, aclnn_bf16_gemm_tt = bf16_gemm_tn, bf16_gemm_tt


def bf16_bmm(a, b, d, c=None, compiled_dims="nk", epilogue=None) -> None:
    """DeepGEMM-Ascend's batched GEMM ``d[i] = a[i] @ b[i]^T (+ c[i])``; ``a[B,M,K]``, ``b[B,N,K]``."""
    api = "deep_gemm.bf16_bmm"
    for name, t in (("a", a), ("b", b)):
        ck.check_rank(api, name, t, 3, "[B, MN, K]")
        _check_dtype(api, name, t, (torch.bfloat16,), "torch.bfloat16")
        _check_major(api, name, t)
    ck.check_dim_size(api, "b", b, 0, "batch", a.shape[0], "a's batch")
    ck.check_dim_size(api, "b", b, 2, "K", a.shape[2], "a's K")
    _check_out(api, d, c, [a.shape[0], a.shape[1], b.shape[1]])
    scale = resolve_alpha(api, None, epilogue)
    if d.numel() == 0:
        return
    d.copy_(_bmm_op(a, b, c, alpha=scale, out_dtype=d.dtype))


_EINSUM_EXPRS = ("bmk,bnk->mn", "bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr")


def einsum(expr, a, b, d, c=None, use_cublaslt=False, epilogue=None) -> None:
    """DeepGEMM's BF16 einsum: ``d (+)= einsum(expr, a, b)`` for its fixed expressions.

    ``'bmk,bnk->mn'``: FP32 ``d`` accumulates and requires ``c is d``; BF16 ``d`` takes no ``c``, and
    ``use_cublaslt`` must be False. ``'bhr,hdr->bhd'`` / ``'bhd,hdr->bhr'``: no ``c``.
    ``'bhd,bhr->hdr'`` (DeepGEMM-Ascend): optional ``c``.
    """
    api = "deep_gemm.einsum"
    ck.check_arg(
        expr in _EINSUM_EXPRS, api, "expr", "value", "one of " + ", ".join(map(repr, _EINSUM_EXPRS)), repr(expr)
    )
    _check_dtype(api, "a", a, (torch.bfloat16,), "torch.bfloat16")
    _check_dtype(api, "b", b, (torch.bfloat16,), "torch.bfloat16")
    if expr == "bmk,bnk->mn":
        ck.check_arg(not use_cublaslt, api, "use_cublaslt", "value", "False for 'bmk,bnk->mn'", use_cublaslt)
        if d.dtype == torch.float32:
            ck.check_arg(
                c is d,
                api,
                "c",
                "value",
                "c is d (FP32 output accumulates in place)",
                "another tensor" if c is not None else None,
            )
        else:
            ck.check_arg(c is None, api, "c", "value", "None for a BF16 output", "a tensor")
    elif expr != "bhd,bhr->hdr":
        ck.check_arg(c is None, api, "c", "value", f"None for {expr!r}", "a tensor")
    shape, _ = einsum_signature(expr, a, b, c, d.dtype)  # the op's own rank and size checks
    _check_out(api, d, c, list(shape))
    scale = resolve_alpha(api, None, epilogue)
    if d.numel():
        d.copy_(_einsum_op(expr, a, b, c, alpha=scale, out_dtype=d.dtype))


# ---- DeepGEMM 2.8 (specs/upstream_2609.md §6): the Muon optimizer's Gram products and the NVFP4 cuBLASLt baseline ----

_SYRK_DTYPES = (torch.bfloat16, torch.float32)


def _batched(api: str, a: torch.Tensor, b: torch.Tensor, d: torch.Tensor) -> None:
    """``d = a @ b^T`` for ``[M, K]`` or ``[B, M, K]`` operands of one dtype (BF16 or FP32, any strides), FP32
    accumulation rounded once into ``d`` (same dtype)."""
    ck.check_arg(a.dim() in (2, 3), api, "a", "rank", "2-D [M, K] or 3-D [B, M, K]", lambda: f"{a.dim()}-D")
    for name, t in (("a", a), ("d", d)):
        _check_dtype(api, name, t, _SYRK_DTYPES, "torch.bfloat16 or torch.float32")
    ck.check_arg(d.dtype == a.dtype, api, "d", "dtype", lambda: f"{a.dtype} (a's)", d.dtype)
    shape = [*a.shape[:-1], b.shape[-2]]
    ck.check_arg(list(d.shape) == shape, api, "d", "shape", lambda: ck.shape_str(shape), lambda: ck.shape_str(d.shape))
    if d.numel() == 0:
        return
    op = _gemm_op if a.dim() == 2 else _bmm_op
    d.copy_(op(a, b, None, out_dtype=d.dtype))


def batched_syrk(a, d) -> None:
    """``d = a @ a^T``: ``a [M, K]`` or ``[B, M, K]`` (either majorness, strided views allowed), ``d [.., M, M]`` of
    a's dtype (BF16 or FP32)."""
    _batched("deep_gemm.batched_syrk", a, a, d)


def batched_symm(a, b, d) -> None:
    """``d = a @ b`` with ``a [B?, M, M]`` symmetric by contract (not read as such: the full product), ``b [B?, M, N]``,
    ``d [B?, M, N]``, one dtype (BF16 or FP32)."""
    api = "deep_gemm.batched_symm"
    ck.check_arg(b.dim() == a.dim(), api, "b", "rank", lambda: f"{a.dim()}-D (a's)", lambda: f"{b.dim()}-D")
    _check_dtype(api, "b", b, (a.dtype,), f"{a.dtype} (a's)")
    ck.check_arg(
        b.shape[-2] == a.shape[-1] == a.shape[-2],
        api,
        "b",
        "size(-2) (M)",
        lambda: f"{a.shape[-1]} (a is [.., M, M])",
        lambda: b.shape[-2],
    )
    _batched(api, a, b.mT, d)


def _nvfp4_operand(api: str, name: str, operand, mn: int | None):
    """FP32 ``[MN, K]`` of an NVFP4 operand: packed E2M1 ``int8 [MN, K/2]`` (K-major, contiguous) and UE4M3 scale
    bytes per 16 values in cuBLASLt's tiled layout ``[ceil(MN/128), ceil(K/64), 32, 4, 4]`` (row ``32a + b`` of a
    128-row tile at ``[b][a]``: the permutation undoes itself)."""
    ok = isinstance(operand, (tuple, list)) and len(operand) == 2
    ck.check_arg(ok, api, name, "value", "a (data, scale factors) pair", type(operand).__name__)
    data, sf = operand
    ck.check_arg(
        data.dtype in (torch.int8, torch.uint8, torch.float4_e2m1fn_x2) and data.dim() == 2 and data.is_contiguous(),
        api,
        name,
        "value",
        "int8 [MN, K/2] packed E2M1, K-major and contiguous",
        lambda: f"{data.dtype} {ck.shape_str(data.shape)}",
    )
    rows, k = data.shape[0], data.shape[1] * 2
    ck.check_arg(k % 32 == 0, api, name, "K", "a multiple of 32", k)
    mt, kt = -(-rows // 128), -(-k // 64)
    ck.check_arg(
        sf.dtype in (torch.uint8, torch.float8_e4m3fn) and sf.numel() == mt * kt * 512,
        api,
        f"sf{name}",
        "value",
        f"{mt * kt * 512} UE4M3 bytes ([{mt}, {kt}, 32, 4, 4], cuBLASLt's tiled layout)",
        lambda: f"{sf.dtype} with {sf.numel()} elements",
    )
    tiles = sf.contiguous().view(torch.uint8).reshape(mt, kt, 32, 4, 4).permute(0, 3, 2, 1, 4)
    scales = tiles.reshape(mt * 128, kt * 4)[:rows, : k // 16].view(torch.float8_e4m3fn).float()
    values = decode_e2m1(unpack_e2m1(data))
    return values * scales.repeat_interleave(16, dim=1)


def cublaslt_nvfp4_gemm_nt(a, b, d, c=None) -> None:
    """cuBLASLt's NVFP4 GEMM (upstream's FP4 x FP4 baseline) ``d = a @ b^T (+ c)``: E2M1 operands with UE4M3 scales
    per 16 (``_nvfp4_operand``); each value times its scale is exact in FP32, accumulated in FP32, rounded once."""
    api = "deep_gemm.cublaslt_nvfp4_gemm_nt"
    av, bv = _nvfp4_operand(api, "a", a, None), _nvfp4_operand(api, "b", b, None)
    ck.check_dim_size(api, "b", bv, 1, "K", av.shape[1], "a's K")
    _check_out(api, d, c, [av.shape[0], bv.shape[0]])
    if d.numel() == 0:
        return
    d.copy_(_gemm_op(av, bv, c, out_dtype=d.dtype))
