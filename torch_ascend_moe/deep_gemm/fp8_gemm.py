"""DeepGEMM(-Ascend)'s block-scaled GEMMs: ``fp8_fp4_gemm_{nt,nn,tn,tt}`` (aliases ``fp8_gemm_*``), ``fp8_bmm``
and ``fp8_einsum``.

Operands are ``(data, scale factors)`` tuples as upstream (specs/deepgemm_api.md §2.3, §3.1, §16.2):
data FP8 E4M3, or packed FP4 as ``int8`` (upstream), ``uint8`` or ``float4_e2m1fn_x2`` (Ascend tests);
scales FP32, ``float8_e8m0fnu``, UE8M0 packed 4 per ``int32`` (upstream) or 2 per ``int16`` (Ascend).
The layout letters transpose data and scales together, as upstream's wrappers do; majorness then comes
from the strides, and an MN-major packed FP4 operand is repacked along K. The math is the
``ascend_moe::fp8_gemm`` family's ops.

An FP8 ``d`` takes the ``FP8Quantization(sfd)`` epilogue (``fp8_einsum``: ``d = (D, SFD)``); see
``deep_gemm.epilogue`` for its contract.

FP32 scales are used verbatim whatever ``disable_ue8m0_cast`` says: that is upstream's SM90 behaviour
and exact; SM100 would round them up to powers of two (a no-op for the UE8M0 scales its tests use).
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.checks.fp8_gemm import einsum_plan, is_fp4, logical_k
from torch_ascend_moe.deep_gemm.epilogue import FP8Quantization, resolve_alpha, write_fp8_output
from torch_ascend_moe.deep_gemm.gemm import _check_out
from torch_ascend_moe.ops.fp8_gemm import fp8_bmm as _fp8_bmm_op
from torch_ascend_moe.ops.fp8_gemm import fp8_einsum as _fp8_einsum_op
from torch_ascend_moe.ops.fp8_gemm import fp8_gemm as _fp8_gemm_op
from torch_ascend_moe.quant import pack_ue8m0_to_int, per_token_cast_to_fp8, scales_to_float, transpose_packed_fp4

_FP4_DTYPES = (torch.int8, torch.uint8, torch.float4_e2m1fn_x2)


def _pair(api: str, name: str, operand) -> tuple[torch.Tensor, torch.Tensor]:
    if not (isinstance(operand, (tuple, list)) and len(operand) == 2):
        raise TypeError(
            f"{api}: argument '{name}': expected a (data, scale factors) tuple, got {type(operand).__name__}"
        )
    return operand[0], operand[1]


def _logical(data: torch.Tensor, sf: torch.Tensor, transposed: bool, gran_k: int):
    """``(data [MN, K] or packed [MN, K/2] uint8, FP32/e8m0 scales [MN-blocks, K-blocks])`` of one operand.

    As upstream, the layout letter only transposes the view (``transposed``: data and scales given with
    K first); majorness then comes from the strides: ``stride(-1) == 1`` is K-major, anything else
    MN-major. Packed FP4 is packed along its contiguous dim, so an MN-major one (``[.., MN/2, K]``, e.g.
    ``transpose_packed_fp4(x).T``) holds ``2 * size(-2)`` rows and is repacked along K for the ops.
    """
    if transposed:
        data, sf = data.mT, sf.mT
    if data.dtype in _FP4_DTYPES:
        data = data.view(torch.uint8)
        if data.stride(-1) != 1:
            packed = data.mT  # [.., K, MN/2]
            groups = packed.reshape(-1, *packed.shape[-2:])
            data = torch.stack([transpose_packed_fp4(x) for x in groups]).view(torch.uint8)
            data = data.view(*packed.shape[:-2], *data.shape[-2:])
    if sf.dtype in (torch.int32, torch.int16):
        sf = scales_to_float(sf)[
            ..., : -(-logical_k(data) // gran_k)
        ]  # packed along K: unpacking may leave padding at the end
    return data, sf


def _whole_k_blocks(a_data, sfa, b_data, sfb, gran_ka: int, gran_kb: int):
    """Both operands with K zero-padded to whole scale blocks of either recipe, where K is not.

    Upstream's kernels read a partial last K block (TMA fills past K with zeros and the block's scale applies to
    its real values; e.g. the dgrad of DeepSeek's 2112-wide projection: K = 2112 with 1x128 scales); the op takes
    whole blocks. Zeros add nothing to a block's sum, and the blocks only the padding fills get scale 1, so the
    product is the same. A no-op when K is already whole (the usual case: no copy)."""
    k = logical_k(a_data)
    whole = k % gran_ka == 0 and k % gran_kb == 0
    if whole or logical_k(b_data) != k or sfa.shape[-1] != -(-k // gran_ka) or sfb.shape[-1] != -(-k // gran_kb):
        return a_data, sfa, b_data, sfb  # whole blocks, or operands the op will refuse with its own error
    unit = math.lcm(gran_ka, gran_kb)
    padded_k = -(-k // unit) * unit

    def pad(data, sf, gran_k):
        wide = data.new_zeros(*data.shape[:-1], padded_k // (2 if is_fp4(data) else 1))  # FP4: two values a byte
        wide[..., : data.shape[-1]] = data
        extra = padded_k // gran_k - sf.shape[-1]
        return wide, torch.cat([sf, sf.new_ones(*sf.shape[:-1], extra)], dim=-1) if extra else sf

    return (*pad(a_data, sfa, gran_ka), *pad(b_data, sfb, gran_kb))


def _check_packings(api: str, sfa: torch.Tensor, sfb: torch.Tensor) -> None:
    """Packed UE8M0 scales of one call use one packing (int32 upstream, int16 Ascend), never a mix."""
    packed = (torch.int32, torch.int16)
    ck.check_arg(
        not (sfa.dtype in packed and sfb.dtype in packed and sfa.dtype != sfb.dtype),
        api,
        "sfb",
        "dtype",
        lambda: f"{sfa.dtype} (the same UE8M0 packing as sfa)",
        sfb.dtype,
    )


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
    _check_packings(api, sfa, sfb)
    # Ranks before the layout letter's transpose (``.mT`` of a 1-D tensor names no argument).
    for name, data, sf, transposed in (("a", a_data, sfa, a_t), ("b", b_data, sfb, b_t)):
        ck.check_rank(api, name, data, 2, "matrix")
        if transposed:
            ck.check_rank(api, f"sf{name}", sf, 2, "scale-factor matrix")
    ra, rb = _resolve_recipes(api, recipe, recipe_a, recipe_b, sfb)
    a_data, sfa = _logical(a_data, sfa, a_t, ra[1])
    b_data, sfb = _logical(b_data, sfb, b_t, rb[1])
    a_data, sfa, b_data, sfb = _whole_k_blocks(a_data, sfa, b_data, sfb, ra[1], rb[1])
    shape = [a_data.shape[0], b_data.shape[0]]
    scale = resolve_alpha(api, alpha, epilogue, fp8_output=True)
    _write(
        api,
        d,
        c,
        shape,
        epilogue,
        lambda dtype: _fp8_gemm_op(a_data, sfa, b_data, sfb, c, recipe_a=ra, recipe_b=rb, alpha=scale, out_dtype=dtype),
    )


def _write(api, d, c, shape, epilogue, compute) -> None:
    """``d := compute(d.dtype)``, or with FP8Quantization the FP32 result cast into ``d`` and ``sfd``."""
    if isinstance(epilogue, FP8Quantization):
        ck.check_arg(c is None, api, "c", "value", "None with an FP8Quantization epilogue", "a tensor")
        ck.check_arg(
            list(d.shape) == list(shape), api, "d", "shape", lambda: ck.shape_str(shape), lambda: ck.shape_str(d.shape)
        )
        write_fp8_output(api, compute(torch.float32), d, epilogue.sfd)
        return
    _check_out(api, d, c, shape)
    if d.numel():
        d.copy_(compute(d.dtype))


def _recipes_3(api: str, recipe) -> tuple[list, list]:
    ck.check_arg(len(recipe) == 3, api, "recipe", "value", "(gran_m, gran_n, gran_k)", tuple(recipe))
    return [recipe[0], recipe[2]], [recipe[1], recipe[2]]


def fp8_bmm(a, b, d, c=None, recipe=(1, 1, 32), compiled_dims="nk", epilogue=None) -> None:
    """DeepGEMM-Ascend's batched scaled GEMM ``d[i] = deq(A[i]) @ deq(B[i])^T (+ c[i])``.

    ``a = (A[B, M, K], sfa[B, ceil(M/gm), K-blocks])``, ``b = (B[B, N, K], sfb)``; FP8 or packed FP4 data,
    scales FP32 / e8m0 / packed int32 or int16 along K. ``d`` BF16/FP32, or FP8 with ``FP8Quantization``.
    """
    api = "deep_gemm.fp8_bmm"
    a_data, sfa = _pair(api, "a", a)
    b_data, sfb = _pair(api, "b", b)
    _check_packings(api, sfa, sfb)
    ra, rb = _recipes_3(api, recipe)
    ck.check_rank(api, "a", a_data, 3, "[B, M, K]")
    ck.check_rank(api, "b", b_data, 3, "[B, N, K]")
    a_data, sfa = _logical(a_data, sfa, False, ra[1])
    b_data, sfb = _logical(b_data, sfb, False, rb[1])
    scale = resolve_alpha(api, None, epilogue, fp8_output=True)
    shape = [a_data.shape[0], a_data.shape[1], b_data.shape[1]]
    _write(
        api,
        d,
        c,
        shape,
        epilogue,
        lambda dtype: _fp8_bmm_op(a_data, sfa, b_data, sfb, c, recipe_a=ra, recipe_b=rb, alpha=scale, out_dtype=dtype),
    )


def fp8_einsum(expr, a, b, d, c=None, recipe=(1, 128, 128)) -> None:
    """DeepGEMM's ``fp8_einsum`` (``'bhr,hdr->bhd'``, ``'bhd,hdr->bhr'``, ``'bhd,bhr->hdr'``) on
    ``(data, sf)`` pairs; ``recipe = (gran_m, gran_n, gran_k)`` maps to ``a``'s output letter, ``b``'s
    output letter and the contracted letter (scales keep their operand's subscripts, e.g.
    ``sfa[B, H, R/128]``, ``sfb[H, D/128, R/128]``). ``d`` BF16/FP32 (``'bhd,bhr->hdr'`` upstream: FP32
    with ``c is d``), or a ``(D, SFD)`` pair for FP8 output (DeepGEMM-Ascend).
    """
    api = "deep_gemm.fp8_einsum"
    a_data, sfa = _pair(api, "a", a)
    b_data, sfb = _pair(api, "b", b)
    ra, rb = _recipes_3(api, recipe)
    epilogue = flat_sfd = None
    if isinstance(d, (tuple, list)):
        d, sfd = _pair(api, "d", d)
        # DeepGEMM 2.8 (CUDA) passes 2-D scales of the flattened rows; DeepGEMM-Ascend per-row ones (its epilogue).
        if sfd.dim() == 2 and d.dim() == 3:
            flat_sfd = sfd
        else:
            epilogue = FP8Quantization(sfd)
    ck.check_arg(
        expr in _EINSUM_EXPRS, api, "expr", "value", "one of " + ", ".join(map(repr, _EINSUM_EXPRS)), repr(expr)
    )
    sa, sb, so, perm_a, perm_b, _ = einsum_plan(expr)
    k_letter = sa[perm_a[2]]
    # Packed UE8M0 scales run along the last dim: unpack when that is the contracted letter.
    if sa[-1] == k_letter:
        a_data, sfa = _logical(a_data, sfa, False, ra[1])
    if sb[-1] == k_letter:
        b_data, sfb = _logical(b_data, sfb, False, rb[1])
    shape = [a_data.shape[sa.index(x)] if x in sa else b_data.shape[sb.index(x)] for x in so]

    def compute(dtype):
        return _fp8_einsum_op(expr, a_data, sfa, b_data, sfb, c, recipe_a=ra, recipe_b=rb, out_dtype=dtype)

    if flat_sfd is not None:
        _write_flat_fp8(api, expr, d, flat_sfd, c, shape, compute)
        return
    _write(api, d, c, shape, epilogue, compute)


def _write_flat_fp8(api, expr, d, sfd, c, shape, compute) -> None:
    """DeepGEMM 2.8's FP8 output of ``'bhr,hdr->bhd'`` (``csrc/apis/einsum.hpp``): ``D`` rounded to BF16, then
    ``per_token_cast_to_fp8`` of its ``[b, h*d]`` rows with UE8M0 scales per 32, packed four to an int32 in
    ``sfd [b, ceil(h*d/128)]`` (written through its strides: upstream's are MN-major, ``(1, align(b, 4))``)."""
    ck.check_arg(expr == "bhr,hdr->bhd", api, "expr", "value", "'bhr,hdr->bhd' with a 2-D sfd", repr(expr))
    ck.check_arg(c is None, api, "c", "value", "None with an FP8 d", "a tensor")
    ck.check_arg(d.dtype == torch.float8_e4m3fn, api, "d", "dtype", "torch.float8_e4m3fn (FP8 output)", d.dtype)
    ck.check_arg(
        list(d.shape) == list(shape), api, "d", "shape", lambda: ck.shape_str(shape), lambda: ck.shape_str(d.shape)
    )
    b, h, dim = shape
    ck.check_arg(dim % 128 == 0, api, "d", "size(2) (d)", "a multiple of 128 with FP8 output", dim)
    want = [b, -(-h * dim // 128)]
    ck.check_arg(sfd.dtype == torch.int32, api, "sfd", "dtype", "torch.int32 (packed UE8M0)", sfd.dtype)
    ck.check_arg(list(sfd.shape) == want, api, "sfd", "shape", want, list(sfd.shape))
    if not d.numel():
        return
    q, sf = per_token_cast_to_fp8(compute(torch.bfloat16).reshape(b, h * dim), use_ue8m0=True, gran_k=32)
    d.copy_(q.view(d.shape))
    sfd.copy_(pack_ue8m0_to_int(sf))


_EINSUM_EXPRS = ("bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr")


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


def fp8_gemm_nt_skip_head_mid(a, b, d, head_splits, recipe=None, compiled_dims="nk", disable_ue8m0_cast=False) -> None:
    """``fp8_gemm_nt`` whose output columns are spread over heads with a gap: ``head_splits = (l, m, r)``,
    ``H = N / (l + r)`` heads, ``d[M, N + H*m]``; head ``h``'s ``l`` then ``r`` product columns go to
    ``d[:, h*(l+m+r) :][: l]`` and ``[l+m : l+m+r]``, its ``m`` middle columns are left untouched.
    FP8 operands with ``gran_k = 128``, no accumulation, ``d`` BF16 or FP32 (upstream's contract)."""
    api = "deep_gemm.fp8_gemm_nt_skip_head_mid"
    a_data, sfa = _pair(api, "a", a)
    b_data, sfb = _pair(api, "b", b)
    for name, t in (("a", a_data), ("b", b_data)):
        ck.check_arg(t.dtype == torch.float8_e4m3fn, api, name, "dtype", torch.float8_e4m3fn, t.dtype)
        ck.check_rank(api, name, t, 2, "[MN, K]")
    left, mid, right = head_splits
    m, n = a_data.shape[0], b_data.shape[0]
    ck.check_arg(
        left + right > 0 and n % (left + right) == 0, api, "head_splits", "value", f"l + r dividing N={n}", head_splits
    )
    heads = n // (left + right)
    _check_out(api, d, None, [m, n + heads * mid])
    _check_packings(api, sfa, sfb)
    ra, rb = _resolve_recipes(api, recipe, None, None, sfb)
    ck.check_arg(ra[1] == rb[1] == 128, api, "recipe", "gran_k", 128, (ra[1], rb[1]))
    if m == 0:
        return
    a_data, sfa = _logical(a_data, sfa, False, ra[1])
    b_data, sfb = _logical(b_data, sfb, False, rb[1])
    product = _fp8_gemm_op(a_data, sfa, b_data, sfb, None, recipe_a=ra, recipe_b=rb, out_dtype=d.dtype)
    # The kernel's epilogue remaps columns; here the same remap is a strided copy into d's head views.
    product, heads_out = product.view(m, heads, left + right), d.unflatten(1, (heads, left + mid + right))
    heads_out[..., :left].copy_(product[..., :left])
    heads_out[..., left + mid :].copy_(product[..., left:])


fp8_gemm_nt, fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt = fp8_fp4_gemm_nt, fp8_fp4_gemm_nn, fp8_fp4_gemm_tn, fp8_fp4_gemm_tt
