"""The "ascend" flavor: DeepGEMM-Ascend 0.1.0.

Sources: the official ``deepseek-ai/DeepGEMM-Ascend`` ``csrc/apis/gemm.hpp`` @ 787919d (the only official file
stored; it adds the host check that ``c`` is the same tensor as ``d``) and the public fork
``Afloat16/DeepGEMM-Ascend`` @ 8491bbb for everything else (``csrc/utils/layout.hpp``, ``csrc/apis/layout.hpp``,
``csrc/apis/einsum.hpp``, ``csrc/jit_kernels/{transform_sf,epilogue_class,fp8_gemm,gemm_config}.hpp``,
``csrc/jit/jit.hpp``, ``deep_gemm/include/deep_gemm/{transform_sf,scheduler}.hpp``, ``deep_gemm/__init__.py``).
Host checks (``DJ_HOST_ASSERT`` / ``DJ_PANIC``, both thrown on the host) raise ``RuntimeError`` quoting the condition
or message and the file; device-side failures raise ``Panic``.
"""

from __future__ import annotations

import types

import torch

from . import _ref
from ._cuda import _ints, _ks, _opt_tensor, _pair, _store, _tensor
from ._ref import F64, align, ceil_div
from ._standin import (
    ASCEND_AI_CORES,
    ASCEND_DEFAULT_NPU_ARCH,
    STATE,
    check,
    fail,
    incompatible,
    not_implemented,
    panic,
    public,
)

FP8, FP4, BF16, F32, I16 = torch.float8_e4m3fn, torch.int8, torch.bfloat16, torch.float32, torch.int16
K_MAJOR, MN_MAJOR = "K", "MN"

OFFICIAL_GEMM = "DeepGEMM-Ascend csrc/apis/gemm.hpp@787919d"
GEMM = "DeepGEMM-Ascend csrc/apis/gemm.hpp"
UTILS = "DeepGEMM-Ascend csrc/utils/layout.hpp"
LAYOUT_API = "DeepGEMM-Ascend csrc/apis/layout.hpp"
TRANSFORM = "DeepGEMM-Ascend csrc/jit_kernels/transform_sf.hpp"
EPILOGUE = "DeepGEMM-Ascend csrc/jit_kernels/epilogue_class.hpp"
EINSUM = "DeepGEMM-Ascend csrc/apis/einsum.hpp"
JIT = "DeepGEMM-Ascend csrc/jit/jit.hpp"


# ---------------------------------------------------------------------------------------------------------------------
# deep_gemm.epilogue (pybind submodule of _C: csrc/apis/epilogue_class.hpp)
# ---------------------------------------------------------------------------------------------------------------------


class Epilogue:
    """Base class of the GEMM epilogue classes."""


class Identity(Epilogue):
    def __init__(self):
        pass


class Alpha(Epilogue):
    def __init__(self, alpha):
        self.alpha = float(torch.tensor(float(alpha), dtype=torch.float32))  # const float&


class FP8Quantization(Epilogue):
    def __init__(self, sfd):
        self.sfd = sfd


epilogue = types.ModuleType("deep_gemm.epilogue", "GEMM epilogue classes")
for _cls in (Epilogue, Identity, Alpha, FP8Quantization):
    setattr(epilogue, _cls.__name__, _cls)


def _epilogue_arg(api, epilogue_class):
    """pybind11 conversion of the ``epilogue`` argument."""
    if epilogue_class is not None and not isinstance(epilogue_class, Epilogue):
        incompatible(api, f"'epilogue' must be a deep_gemm.epilogue.Epilogue or None, got {type(epilogue_class)}")
    return epilogue_class


def _resolve_epilogue(api, epilogue_class, c, d, alpha=None, sfd=None):
    """``resolve_epilogue_class`` (epilogue_class.hpp): returns the float32 multiplier applied to A @ B (1.0 for
    Identity)."""
    check(
        (epilogue_class is not None) + (alpha is not None) + (sfd is not None) <= 1,
        EPILOGUE,
        "(epilogue_class != nullptr) + alpha.has_value() + sfd.has_value() <= 1: "
        "The epilogue class, alpha and the FP8 output pair are exclusive",
    )
    if alpha is not None:
        scale = float(torch.tensor(float(alpha), dtype=torch.float32))
    elif sfd is not None or isinstance(epilogue_class, FP8Quantization):
        raise NotImplementedError(
            "DeepGEMM stand-in: FP8 output (FP8Quantization epilogue / (D, SFD) pair) is not modelled"
        )
    elif isinstance(epilogue_class, Alpha):
        scale = epilogue_class.alpha
    else:
        scale = 1.0
    # EpilogueClass::check (Identity / Alpha)
    check(d.dtype in (BF16, F32), EPILOGUE, "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat")
    return scale


# ---------------------------------------------------------------------------------------------------------------------
# csrc/utils/layout.hpp
# ---------------------------------------------------------------------------------------------------------------------


def _strides(t):
    return "[" + ", ".join(str(s) for s in t.stride()) + "]"


def _major_check(t):
    if t.stride(-2) == 1 and t.stride(-1) == 1:
        fail(UTILS, f"Ambiguous major axis, the tensor has both last two dimensions contiguous, strides={_strides(t)}")
    check(t.stride(-2) == 1 or t.stride(-1) == 1, UTILS, "t.stride(-2) == 1 or t.stride(-1) == 1")


def _major_ab(t):
    _major_check(t)
    return K_MAJOR if t.stride(-1) == 1 else MN_MAJOR


def _check_cd(d):
    _major_check(d)
    check(d.stride(-1) == 1, UTILS, "d.stride(-1) == 1")


def _main_axis(t):
    return next((i for i in range(t.dim()) if t.stride(i) == 1), -1)


def _shape_by_spec(out_dims, *specs):
    """``get_shape_by_spec``: every tensor must have one dim per letter and a unit-stride axis; a letter's size must
    agree across tensors (packed FP4 doubles along its first unit-stride axis)."""
    majors = []
    for i, (t, dims) in enumerate(specs):
        if t.dim() != len(dims):
            fail(UTILS, f'Shape mismatch: tensor #{i}, annotation="{dims}"')
        ax = _main_axis(t)
        if ax < 0:
            fail(UTILS, f'Tensor #{i} annotation="{dims}" doesn\'t have major axis, strides={_strides(t)}')
        majors.append(ax)
    result = []
    for name in out_dims:
        value, first = None, None
        for i, (t, dims) in enumerate(specs):
            for axis, ch in enumerate(dims):
                if ch != name:
                    continue
                v = int(t.size(axis)) * (2 if t.dtype == FP4 and axis == majors[i] else 1)
                if value is None:
                    value, first = v, (i, dims, axis)
                elif v != value:
                    fail(
                        UTILS,
                        f"Conflicting shape dimension '{name}': tensor #{i} annotation=\"{dims}\" axis={axis} "
                        f'gives {v}, but tensor #{first[0]} annotation="{first[1]}" axis={first[2]} gives '
                        f"{value}",
                    )
        result.append(value if value is not None else 0)
    return tuple(result)


def _early_return(m, n, k, d, c, sfd=None):
    """``gemm_early_return``."""
    if m == 0 or n == 0:
        return True
    check(sfd is None or c is None, UTILS, "not sfd.has_value() or not c.has_value()")
    is_cd_same = c is not None and c.data_ptr() == d.data_ptr()
    if is_cd_same:
        check(
            c.shape == d.shape and c.stride() == d.stride(),
            UTILS,
            "c->sizes() == d.sizes() and c->strides() == d.strides()",
        )
    check(
        d.dtype in (BF16, F32, FP8),
        UTILS,
        "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat"
        " or d.scalar_type() == torch::kFloat8_e4m3fn",
    )
    check((d.dtype == FP8) == (sfd is not None), UTILS, "(d.scalar_type() == torch::kFloat8_e4m3fn) == sfd.has_value()")
    if c is not None:
        _check_cd(c)
        check(d.dtype == c.dtype, UTILS, "d.scalar_type() == c.value().scalar_type()")
    if k == 0:
        if not is_cd_same:
            d.copy_(c) if c is not None else d.zero_()
        return True
    if c is not None and not is_cd_same:
        d.copy_(c)
    return False


# ---------------------------------------------------------------------------------------------------------------------
# Scale factors: csrc/apis/layout.hpp + csrc/jit_kernels/transform_sf.hpp (+ the device kernel's validation)
# ---------------------------------------------------------------------------------------------------------------------


def _check_sf_layout(sf, mn, k, gran_mn, gran_k, num_groups):
    """Returns True when ``sf`` already is the required layout (int16, gran_mn 1, MN-major)."""
    check(sf.dtype in (F32, I16), LAYOUT_API, "sf.scalar_type() == torch::kFloat or sf.scalar_type() == torch::kShort")
    check(
        sf.dim() == int(num_groups is not None) + 2,
        LAYOUT_API,
        "sf.dim() == static_cast<int>(num_groups.has_value()) + 2",
    )
    check(
        sf.stride(-1) == 1 or sf.stride(-2) == 1,
        LAYOUT_API,
        "sf.stride(-1) == 1 or sf.stride(-2) == 1: SF input must be contiguous in either the last or "
        "second-to-last dimension",
    )
    if num_groups is not None:
        check(sf.size(-3) == num_groups, LAYOUT_API, "sf.size(-3) == num_groups.value()")
    shape_div_k = gran_k if sf.dtype == F32 else gran_k * 2
    check(sf.size(-2) == ceil_div(mn, gran_mn), LAYOUT_API, "sf.size(-2) == ceil_div(mn, gran_mn)")
    check(sf.size(-1) == ceil_div(k, shape_div_k), LAYOUT_API, "sf.size(-1) == ceil_div(k, shape_div_k)")
    check(gran_k == 32, LAYOUT_API, "gran_k == 32: gran_k must be 32")
    if sf.dtype == I16 and gran_mn == 1 and sf.stride(-2) == 1 and sf.stride(-1) == sf.size(-2):
        return num_groups is None or sf.stride(-3) == sf.size(-2) * sf.size(-1)
    return False


def _group_tails(grouped_layout, gran_group):
    """SF rows (m-grouped) / columns (k-grouped) the transform kernel clears instead of reading: for every group end
    ``e``, ``[ceil(e / gran), align(ceil(e / gran), 256 / gran))`` (transform_sf.hpp ``prepare_grouped_input``)."""
    group_alignment = STATE.mk_alignment // gran_group
    spans = []
    for end in grouped_layout.tolist():
        tail = ceil_div(max(end, 0), gran_group)
        spans.append((tail, align(tail, group_alignment)))
    return spans


def _launch_transform_sf(sf, shape_m, gran_mn, gemm_type, grouped_layout=None):
    """``launch_transform_sf``: -> int16 ``[.., shape_m, ceil(K / 64)]`` (MN-major), UE8M0 pairs, rows repeated
    ``gran_mn`` times. FP32 input is validated on the device (sign and mantissa must be zero)."""
    sf_dims = sf.dim()
    check(
        sf_dims in (2, 3),
        TRANSFORM,
        f"sf_dims == 2 or sf_dims == 3: Transform SF input must have 2 or 3 dimensions, but got {sf_dims}",
    )
    b = sf.unsqueeze(0) if sf_dims == 2 else sf
    check(
        1 <= gran_mn <= 128 and (gran_mn & (gran_mn - 1)) == 0,
        TRANSFORM,
        "gran_mn >= 1 and gran_mn <= 128 and (gran_mn & (gran_mn - 1)) == 0: "
        "gran_mn only support a power of two in [1, 128]",
    )
    is_float = sf.dtype == F32
    num_batches = b.size(0)
    grouped = gemm_type in ("m_grouped", "k_grouped")
    if grouped:
        check(
            num_batches == 1 and grouped_layout is not None,
            TRANSFORM,
            "num_batches == 1 and grouped_layout.has_value(): Grouped transform SF requires one logical batch and "
            "grouped_layout",
        )
        check(
            grouped_layout.device == sf.device,
            TRANSFORM,
            "grouped_layout->device() == sf.device(): grouped_layout must be on the same device as the SF input",
        )
        check(
            grouped_layout.dtype == torch.int32 and grouped_layout.dim() == 1 and grouped_layout.is_contiguous(),
            TRANSFORM,
            "grouped_layout->scalar_type() == at::kInt and grouped_layout->dim() == 1 and "
            "grouped_layout->is_contiguous(): grouped_layout must be a contiguous 1D int32 tensor",
        )
        check(grouped_layout.numel() > 0, TRANSFORM, "num_groups > 0: grouped_layout must contain at least one group")
    src_m, src_k = int(b.size(-2)), int(b.size(-1))
    dst_k = ceil_div(src_k, 2) if is_float else src_k
    out = torch.empty((num_batches, dst_k, shape_m), dtype=I16).transpose(-2, -1)
    if out.numel() == 0:
        return out.squeeze(0) if sf_dims == 2 else out
    if is_float:
        codes, exact = _ref.fp32_codes(b)
        cleared = torch.zeros((src_m, src_k), dtype=torch.bool)
        if gemm_type == "m_grouped":
            for lo, hi in _group_tails(grouped_layout, gran_mn):
                cleared[lo:hi, :] = True
        elif gemm_type == "k_grouped":
            for lo, hi in _group_tails(grouped_layout, 32):
                cleared[:, lo:hi] = True
        bad = ~exact & ~cleared
        if bool(bad.any()):
            idx = [int(i) for i in bad.nonzero()[0]]
            value = float(b[tuple(idx)])
            panic(
                f'FP32 scale factors must be non-negative with a zero mantissa on DeepGEMM-Ascend ("when sfA is '
                f"fp32, only 8-bit exponential is used, 23-bit mantissa must be 0, otherwise the kernel will "
                f'panic", csrc/apis/gemm.hpp), but element {idx[1:] if sf_dims == 2 else idx} is {value!r}: the '
                f"transform_sf kernel's ascendc_assert (deep_gemm/include/deep_gemm/transform_sf.hpp "
                f"check_validation) would fire on the device"
            )
        codes = torch.where(cleared, torch.zeros_like(codes), codes)
        words = _ref.pack_bytes(_ref.pad_last(codes, dst_k * 2), 2)  # [B, src_m, dst_k]
    else:
        words = b.to(torch.int64)
    rows = torch.arange(shape_m) // gran_mn
    out.copy_(words.index_select(-2, rows).to(I16))
    return out.squeeze(0) if sf_dims == 2 else out


def _transform_sf(sf, mn, k, recipe, num_groups, is_sfa, disable_ue8m0_cast, psum_layout):
    check(is_sfa is not None, LAYOUT_API, "is_sfa.has_value()")
    gran_mn = recipe[0] if is_sfa else recipe[1]
    gran_k = recipe[2]
    if _check_sf_layout(sf, mn, k, gran_mn, gran_k, num_groups):
        return sf
    if sf.dtype == F32:
        check(
            not disable_ue8m0_cast,
            LAYOUT_API,
            "!disable_ue8m0_cast: Float32 SF must be converted into ue8m0, but disable_ue8m0_cast is set true",
        )
    gemm_type = "m_grouped" if psum_layout is not None else ("batched" if num_groups is not None else "normal")
    return _launch_transform_sf(sf, mn, gran_mn, gemm_type, psum_layout)


def _transform_k_grouped_sf(sf, mn, k, recipe, is_sfa, psum_layout):
    check(is_sfa is not None, LAYOUT_API, "is_sfa.has_value()")
    gran_mn = recipe[0] if is_sfa else recipe[1]
    gran_k = recipe[2]
    if _check_sf_layout(sf, mn, k, gran_mn, gran_k, None):
        return sf
    return _launch_transform_sf(sf, mn, gran_mn, "k_grouped", psum_layout)


def _get_recipe(recipe, recipe_a, recipe_b):
    check(
        not (recipe is not None and (recipe_a is not None or recipe_b is not None)),
        LAYOUT_API,
        "not (recipe.has_value() and (recipe_a.has_value() or recipe_b.has_value()))",
    )
    if recipe is not None:
        return recipe
    gran_m, gran_k_a = recipe_a if recipe_a is not None else (1, 32)
    gran_n, gran_k_b = recipe_b if recipe_b is not None else (1, 32)
    check(gran_k_a == gran_k_b, LAYOUT_API, "gran_k_a == gran_k_b: gran_k of recipe_a and recipe_b must be the same")
    return (gran_m, gran_n, gran_k_a)


def _sf_values(t, mn, k):
    """Element scales ``[.., mn, k]`` from a required-layout int16 tensor ``[.., mn, ceil(k / 64)]``."""
    codes = _ref.unpack_bytes(t, 2)
    return _ref.expand_scales(_ref.ue8m0_values(codes), mn, k, 1, 32)


# ---------------------------------------------------------------------------------------------------------------------
# get_gemm_desc (csrc/apis/gemm.hpp)
# ---------------------------------------------------------------------------------------------------------------------


def _gemm_desc(
    gemm_type, a, b, d, c, sfa_in, sfb_in, recipe, recipe_a, recipe_b, grouped_layout, disable_ue8m0_cast=False
):
    """Host part of ``get_gemm_desc``; returns None on early return, else a dict with the shapes, majors and the
    transformed (int16) scale factors."""
    major_a, major_b = _major_ab(a), _major_ab(b)
    g = 0
    if gemm_type == "normal":
        m, n, k = _shape_by_spec("mnk", (a, "mk"), (b, "nk"), (d, "mn"))
    elif gemm_type == "batched":
        g, m, n, k = _shape_by_spec("bmnk", (a, "bmk"), (b, "bnk"), (d, "bmn"))
    elif gemm_type == "m_grouped":
        g, m, n, k = _shape_by_spec("gmnk", (a, "mk"), (b, "gnk"), (d, "mn"), (grouped_layout, "g"))
        check(major_a == K_MAJOR, GEMM, "major_a == Major::K")
    else:
        g, m, n, k = _shape_by_spec("gmnk", (a, "mk"), (b, "nk"), (d, "gmn"), (grouped_layout, "g"))
        check(major_a == MN_MAJOR, GEMM, "major_a == Major::MN")
        check(major_b == MN_MAJOR, GEMM, "major_b == Major::MN")
        check(c is not None, GEMM, "c.has_value(): K-grouped GEMM requires accumulation into C")
    _check_cd(d)
    if grouped_layout is not None:
        check(grouped_layout.is_contiguous(), GEMM, "grouped_layout->is_contiguous()")
        check(grouped_layout.dtype == torch.int32, GEMM, "grouped_layout->scalar_type() == torch::kInt")
    if c is not None:
        check(
            c.data_ptr() == d.data_ptr(),
            OFFICIAL_GEMM,
            "c->data_ptr() == d.data_ptr(): c must be the same tensor as d; the kernel accumulates into d in place",
        )
    if _early_return(m, n, k, d, c):
        return None
    tsfa = tsfb = None
    if sfa_in is not None or sfb_in is not None:
        recipe = _get_recipe(recipe, recipe_a, recipe_b)
    if sfa_in is not None:
        if gemm_type == "k_grouped":
            tsfa = _transform_k_grouped_sf(sfa_in, m, k, recipe, True, grouped_layout)
        else:
            tsfa = _transform_sf(
                sfa_in,
                m,
                k,
                recipe,
                g if gemm_type == "batched" else None,
                True,
                disable_ue8m0_cast,
                grouped_layout if gemm_type == "m_grouped" else None,
            )
    if sfb_in is not None:
        if gemm_type == "k_grouped":
            tsfb = _transform_k_grouped_sf(sfb_in, n, k, recipe, False, grouped_layout)
        else:
            tsfb = _transform_sf(
                sfb_in,
                n,
                k,
                recipe,
                g if gemm_type in ("batched", "m_grouped") else None,
                False,
                disable_ue8m0_cast,
                None,
            )
    return dict(g=g, m=m, n=n, k=k, major_a=major_a, major_b=major_b, sfa=tsfa, sfb=tsfb)


def _dispatch_fp8_fp4(a, b, desc):
    """``dispatch_fp8_fp4_gemm``: FP8xFP8, FP4xFP4, FP8xFP4 (the FP4xFP4 kernel is K-major only, fp8_gemm.hpp)."""
    pair = (a.dtype, b.dtype)
    if pair not in ((FP8, FP8), (FP4, FP4), (FP8, FP4)):
        fail(GEMM, "false: Unsupported operand dtypes")
    if pair == (FP4, FP4) and (desc["major_a"] != K_MAJOR or desc["major_b"] != K_MAJOR):
        panic(
            'the FP4 x FP4 kernel handles K-major A/B only (csrc/jit_kernels/fp8_gemm.hpp: "FP4 MX GEMM (K-major '
            'A/B only"), and nothing on the host checks it: an MN-major packed FP4 operand would be misread'
        )


def _operand(t):
    return _ref.operand_values(t, _main_axis(t) if t.dtype == FP4 else None)


def _dequant(t, sf, mn, k):
    return _operand(t) * _sf_values(sf, mn, k)


# ---------------------------------------------------------------------------------------------------------------------
# GEMMs
# ---------------------------------------------------------------------------------------------------------------------


def _fp8_fp4_gemm(
    api, trans_a, trans_b, a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast, alpha, epilogue_
):
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    d = _tensor(d, api, "d")
    epilogue_ = _epilogue_arg(api, epilogue_)
    c = _opt_tensor(c, api, "c")
    recipe = _ints(recipe, 3, api, "recipe")
    recipe_a = _ints(recipe_a, 2, api, "recipe_a")
    recipe_b = _ints(recipe_b, 2, api, "recipe_b")
    if trans_a:
        A, sfa = A.transpose(0, 1), sfa.transpose(0, 1)
    if trans_b:
        B, sfb = B.transpose(0, 1), sfb.transpose(0, 1)
    check(d.dtype in (BF16, F32), GEMM, "d.scalar_type() == at::kBFloat16 or d.scalar_type() == at::kFloat")
    scale = _resolve_epilogue(api, epilogue_, c, d, alpha)
    desc = _gemm_desc("normal", A, B, d, c, sfa, sfb, recipe, recipe_a, recipe_b, None, disable_ue8m0_cast)
    if desc is None:
        return
    _dispatch_fp8_fp4(A, B, desc)
    m, n, k = desc["m"], desc["n"], desc["k"]
    prod = _ref.mm_nt(_dequant(A, desc["sfa"], m, k), _dequant(B, desc["sfb"], n, k))
    acc = d.to(F64) if c is not None else 0.0
    _store(d, acc + scale * prod)


def _make_fp8_fp4_gemm(suffix, trans_a, trans_b, compiled_default):
    api = f"fp8_fp4_gemm_{suffix}"

    def fn(
        a,
        b,
        d,
        c=None,
        recipe=None,
        recipe_a=None,
        recipe_b=None,
        compiled_dims=compiled_default,
        disable_ue8m0_cast=False,
        alpha=None,
        epilogue=None,
    ):
        _fp8_fp4_gemm(
            api,
            trans_a,
            trans_b,
            a,
            b,
            d,
            c,
            recipe,
            recipe_a,
            recipe_b,
            compiled_dims,
            disable_ue8m0_cast,
            alpha,
            epilogue,
        )

    fn.__name__ = api
    fn.__doc__ = (
        f"D = alpha * (A @ B^T) (+ D when c is d); {suffix}: A given as "
        f"{'[K, M]' if trans_a else '[M, K]'}, B as {'[K, N]' if trans_b else '[N, K]'} (DeepGEMM-Ascend "
        f"template fp8_fp4_gemm<{str(trans_a).lower()}, {str(trans_b).lower()}>)."
    )
    return public(api)(fn)


def _bf16_gemm(api, trans_a, trans_b, a, b, d, c, compiled_dims, alpha, epilogue_):
    a = _tensor(a, api, "a")
    b = _tensor(b, api, "b")
    d = _tensor(d, api, "d")
    epilogue_ = _epilogue_arg(api, epilogue_)
    c = _opt_tensor(c, api, "c")
    if trans_a:
        a = a.transpose(0, 1)
    if trans_b:
        b = b.transpose(0, 1)
    check(a.dtype == BF16, GEMM, "a.scalar_type() == torch::kBFloat16")
    check(b.dtype == BF16, GEMM, "b.scalar_type() == torch::kBFloat16")
    check(d.dtype in (BF16, F32), GEMM, "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat")
    scale = _resolve_epilogue(api, epilogue_, c, d, alpha)
    desc = _gemm_desc("normal", a, b, d, c, None, None, None, None, None, None)
    if desc is None:
        return
    acc = d.to(F64) if c is not None else 0.0
    _store(d, acc + scale * _ref.mm_nt(a, b))


def _make_bf16_gemm(suffix, trans_a, trans_b, compiled_default):
    api = f"bf16_gemm_{suffix}"

    def fn(a, b, d, c=None, compiled_dims=compiled_default, alpha=None, epilogue=None):
        _bf16_gemm(api, trans_a, trans_b, a, b, d, c, compiled_dims, alpha, epilogue)

    fn.__name__ = api
    return public(api)(fn)


def _m_grouped_write(d, a_deq, b_deq, grouped_layout, ensure_zero_padding):
    """psum layout only; gap rows ``[end_g, align(end_g, 256))`` written 0 when ``ensure_zero_padding`` and left
    untouched otherwise (the convention of the fhgffy fork's padding test); rows after the last group untouched."""
    m = a_deq.shape[0]
    alignment = STATE.mk_alignment
    vals = grouped_layout.tolist()
    prev_end = 0
    for g, end in enumerate(vals):
        start = 0 if g == 0 else align(prev_end, alignment)
        if end < start:
            panic(
                f"psum grouped_layout[{g}] = {end} is smaller than the group's start {start} "
                f"(= align(grouped_layout[{g - 1}], {alignment})): the scheduler computes an unsigned "
                f"{end} - {start} rows and walks past the tensors (deep_gemm/include/deep_gemm/scheduler.hpp)"
            )
        if end > m:
            panic(f"psum grouped_layout[{g}] = {end} exceeds M = {m}: the kernel reads and writes rows past A/D")
        prev_end = end
    prev_end = 0
    for g, end in enumerate(vals):
        start = 0 if g == 0 else align(prev_end, alignment)
        if end > start:
            _store(d[start:end], _ref.mm_nt(a_deq[start:end], b_deq[g]))
        gap_end = min(align(end, alignment), m)
        if ensure_zero_padding and gap_end > end:
            d[end:gap_end].zero_()
        prev_end = end


def _m_grouped_fp8_fp4(
    api,
    trans_b,
    a,
    b,
    d,
    grouped_layout,
    recipe,
    recipe_a,
    recipe_b,
    compiled_dims,
    disable_ue8m0_cast,
    use_psum_layout,
    ensure_zero_padding,
    expected_m_for_psum_layout,
    epilogue_,
):
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    d = _tensor(d, api, "d")
    epilogue_ = _epilogue_arg(api, epilogue_)
    grouped_layout = _tensor(grouped_layout, api, "grouped_layout")
    recipe = _ints(recipe, 3, api, "recipe")
    recipe_a = _ints(recipe_a, 2, api, "recipe_a")
    recipe_b = _ints(recipe_b, 2, api, "recipe_b")
    if trans_b:
        B, sfb = B.transpose(1, 2), sfb.transpose(1, 2)
    check(A.dtype in (FP8, FP4), GEMM, "a.scalar_type() == torch::kFloat8_e4m3fn or a.scalar_type() == kPackedFP4")
    check(B.dtype in (FP8, FP4), GEMM, "b.scalar_type() == torch::kFloat8_e4m3fn or b.scalar_type() == kPackedFP4")
    check(d.dtype in (BF16, F32), GEMM, "d.scalar_type() == at::kBFloat16 or d.scalar_type() == at::kFloat")
    check(bool(use_psum_layout), GEMM, "use_psum_layout == true")
    _resolve_epilogue(api, epilogue_, None, d)
    desc = _gemm_desc(
        "m_grouped", A, B, d, None, sfa, sfb, recipe, recipe_a, recipe_b, grouped_layout, disable_ue8m0_cast
    )
    if desc is None:
        return
    _dispatch_fp8_fp4(A, B, desc)
    m, n, k = desc["m"], desc["n"], desc["k"]
    _m_grouped_write(
        d, _dequant(A, desc["sfa"], m, k), _dequant(B, desc["sfb"], n, k), grouped_layout, bool(ensure_zero_padding)
    )


def _make_m_grouped_fp8_fp4(suffix, trans_b):
    api = f"m_grouped_fp8_fp4_gemm_{suffix}_contiguous"

    def fn(
        a,
        b,
        d,
        grouped_layout,
        recipe=None,
        recipe_a=None,
        recipe_b=None,
        compiled_dims="nk",
        disable_ue8m0_cast=False,
        use_psum_layout=True,
        ensure_zero_padding=True,
        expected_m_for_psum_layout=None,
        epilogue=None,
    ):
        _m_grouped_fp8_fp4(
            api,
            trans_b,
            a,
            b,
            d,
            grouped_layout,
            recipe,
            recipe_a,
            recipe_b,
            compiled_dims,
            disable_ue8m0_cast,
            use_psum_layout,
            ensure_zero_padding,
            expected_m_for_psum_layout,
            epilogue,
        )

    fn.__name__ = api
    return public(api)(fn)


def _m_grouped_bf16(
    api,
    trans_b,
    a,
    b,
    d,
    grouped_layout,
    compiled_dims,
    use_psum_layout,
    ensure_zero_padding,
    expected_m_for_psum_layout,
    epilogue_,
):
    a = _tensor(a, api, "a")
    b = _tensor(b, api, "b")
    d = _tensor(d, api, "d")
    epilogue_ = _epilogue_arg(api, epilogue_)
    grouped_layout = _tensor(grouped_layout, api, "grouped_layout")
    if trans_b:
        b = b.transpose(1, 2)
    check(a.dtype == BF16, GEMM, "a.scalar_type() == torch::kBFloat16")
    check(b.dtype == BF16, GEMM, "b.scalar_type() == torch::kBFloat16")
    check(d.dtype in (BF16, F32), GEMM, "d.scalar_type() == at::kBFloat16 or d.scalar_type() == at::kFloat")
    check(bool(use_psum_layout), GEMM, "use_psum_layout == true")
    _resolve_epilogue(api, epilogue_, None, d)
    desc = _gemm_desc("m_grouped", a, b, d, None, None, None, None, None, None, grouped_layout, True)
    if desc is None:
        return
    _m_grouped_write(d, a.to(F64), b.to(F64), grouped_layout, bool(ensure_zero_padding))


def _make_m_grouped_bf16(suffix, trans_b):
    api = f"m_grouped_bf16_gemm_{suffix}_contiguous"

    def fn(
        a,
        b,
        d,
        grouped_layout,
        compiled_dims="nk",
        use_psum_layout=True,
        ensure_zero_padding=True,
        expected_m_for_psum_layout=None,
        epilogue=None,
    ):
        _m_grouped_bf16(
            api,
            trans_b,
            a,
            b,
            d,
            grouped_layout,
            compiled_dims,
            use_psum_layout,
            ensure_zero_padding,
            expected_m_for_psum_layout,
            epilogue,
        )

    fn.__name__ = api
    return public(api)(fn)


def _k_groups(grouped_layout, k):
    """psum K groups: ``[align(end_{g-1}, 256), end_g)`` (scheduler.hpp KGroupedContiguousWithPsumLayout)."""
    alignment = STATE.mk_alignment
    groups, prev_end = [], 0
    for g, end in enumerate(grouped_layout.tolist()):
        start = 0 if g == 0 else align(prev_end, alignment)
        if end < start:
            panic(
                f"psum grouped_layout[{g}] = {end} is smaller than the group's start {start} "
                f"(= align(grouped_layout[{g - 1}], {alignment})): the scheduler computes an unsigned shape_k and "
                f"reads far past A/B"
            )
        if end > k:
            panic(f"psum grouped_layout[{g}] = {end} exceeds K = {k}: the kernel reads past A/B")
        groups.append((start, end))
        prev_end = end
    return groups


def _k_grouped_prologue(a_t, b_t, d, grouped_layout):
    g, m, n, k = _shape_by_spec("gmnk", (a_t, "mk"), (b_t, "nk"), (d, "gmn"), (grouped_layout, "g"))
    return g, k


def _k_grouped_expected_k(ks_cpu, k, g):
    if not ks_cpu and g == 0:
        panic("grouped_layout is empty: expected_k_from_ks(ks_cpu, k / g) divides by zero on the host (SIGFPE)")


@public("k_grouped_fp8_gemm_tn_contiguous")
def k_grouped_fp8_gemm_tn_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 32), compiled_dims="mn", use_psum_layout=True, epilogue=None
):
    """psum K groups: D[g] += A[start_g:end_g]^T @ B[start_g:end_g], A [K, M], B [K, N] (MN-major), D [G, M, N],
    ``c`` must be ``d``; scale factors given in A's orientation, ``[ceil(K / 32), ceil(M / gran_m)]``."""
    api = "k_grouped_fp8_gemm_tn_contiguous"
    _k_grouped_fp8_tn(api, a, b, d, ks_cpu, grouped_layout, c, recipe, compiled_dims, use_psum_layout, epilogue)


def _k_grouped_fp8_tn(api, a, b, d, ks_cpu, grouped_layout, c, recipe, compiled_dims, use_psum_layout, epilogue_):
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    d = _tensor(d, api, "d")
    epilogue_ = _epilogue_arg(api, epilogue_)
    ks_cpu = _ks(ks_cpu, api)
    grouped_layout = _tensor(grouped_layout, api, "grouped_layout")
    c = _opt_tensor(c, api, "c")
    recipe = _ints(recipe, 3, api, "recipe", optional=False)
    A, sfa, B, sfb = A.transpose(0, 1), sfa.transpose(0, 1), B.transpose(0, 1), sfb.transpose(0, 1)
    g, k = _k_grouped_prologue(A, B, d, grouped_layout)
    check(A.dtype in (FP8, FP4), GEMM, "a.scalar_type() == torch::kFloat8_e4m3fn or a.scalar_type() == kPackedFP4")
    check(B.dtype in (FP8, FP4), GEMM, "b.scalar_type() == torch::kFloat8_e4m3fn or b.scalar_type() == kPackedFP4")
    check(d.dtype in (BF16, F32), GEMM, "d.scalar_type() == at::kBFloat16 or d.scalar_type() == at::kFloat")
    check(bool(use_psum_layout), GEMM, "use_psum_layout == true")
    _k_grouped_expected_k(ks_cpu, k, g)
    _resolve_epilogue(api, epilogue_, c, d)
    desc = _gemm_desc("k_grouped", A, B, d, c, sfa, sfb, recipe, None, None, grouped_layout)
    if desc is None:
        return
    _dispatch_fp8_fp4(A, B, desc)
    m, n = desc["m"], desc["n"]
    a_deq = _dequant(A, desc["sfa"], m, k)
    b_deq = _dequant(B, desc["sfb"], n, k)
    for gi, (start, end) in enumerate(_k_groups(grouped_layout, k)):
        if end > start:
            _store(d[gi], d[gi].to(F64) + _ref.mm_nt(a_deq[:, start:end], b_deq[:, start:end]))


@public("k_grouped_fp8_gemm_nt_contiguous")
def k_grouped_fp8_gemm_nt_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 32), compiled_dims="mn", use_psum_layout=True, epilogue=None
):
    """Deprecated shim: emits a DeprecationWarning, transposes A/B (and their scales) and forwards to the tn path."""
    import warnings

    api = "k_grouped_fp8_gemm_nt_contiguous"
    warnings.warn(
        "Calling k_grouped_fp8_gemm_nt_contiguous is deprecated, please transpose a, b into [k, m] and "
        "[k, n] shape and call `k_grouped_fp8_gemm_tn_contiguous` instead",
        DeprecationWarning,
        stacklevel=3,
    )
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    _k_grouped_fp8_tn(
        api,
        (A.transpose(0, 1), sfa.transpose(0, 1)),
        (B.transpose(0, 1), sfb.transpose(0, 1)),
        d,
        ks_cpu,
        grouped_layout,
        c,
        recipe,
        compiled_dims,
        use_psum_layout,
        epilogue,
    )


@public("k_grouped_bf16_gemm_tn_contiguous")
def k_grouped_bf16_gemm_tn_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, compiled_dims="mn", use_psum_layout=True, epilogue=None
):
    api = "k_grouped_bf16_gemm_tn_contiguous"
    a = _tensor(a, api, "a").transpose(0, 1)
    b = _tensor(b, api, "b").transpose(0, 1)
    d = _tensor(d, api, "d")
    epilogue = _epilogue_arg(api, epilogue)
    ks_cpu = _ks(ks_cpu, api)
    grouped_layout = _tensor(grouped_layout, api, "grouped_layout")
    c = _opt_tensor(c, api, "c")
    g, k = _k_grouped_prologue(a, b, d, grouped_layout)
    check(a.dtype == BF16, GEMM, "a.scalar_type() == torch::kBFloat16")
    check(b.dtype == BF16, GEMM, "b.scalar_type() == torch::kBFloat16")
    check(d.dtype in (BF16, F32), GEMM, "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat")
    check(bool(use_psum_layout), GEMM, "use_psum_layout == true")
    _k_grouped_expected_k(ks_cpu, k, g)
    _resolve_epilogue(api, epilogue, c, d)
    desc = _gemm_desc("k_grouped", a, b, d, c, None, None, None, None, None, grouped_layout)
    if desc is None:
        return
    for gi, (start, end) in enumerate(_k_groups(grouped_layout, k)):
        if end > start:
            _store(d[gi], d[gi].to(F64) + _ref.mm_nt(a[:, start:end], b[:, start:end]))


def _fp8_bmm(api, A, sfa, B, sfb, d, c, recipe, epilogue_):
    """csrc/apis/einsum.hpp ``fp8_bmm`` after argument conversion (also the target of ``fp8_einsum``)."""
    check(A.dtype == FP8, EINSUM, "a.scalar_type() == at::kFloat8_e4m3fn")
    check(B.dtype == FP8, EINSUM, "b.scalar_type() == at::kFloat8_e4m3fn")
    batch, m, n, k = _shape_by_spec("bmnk", (A, "bmk"), (B, "bnk"), (d, "bmn"))
    check(A.stride(-1) == 1 or A.stride(-2) == 1, EINSUM, "a.stride(-1) == 1 or a.stride(-2) == 1")
    check(B.stride(-1) == 1 or B.stride(-2) == 1, EINSUM, "b.stride(-1) == 1 or b.stride(-2) == 1")
    check(d.stride(-1) == 1, EINSUM, "d_tensor.stride(-1) == 1")
    if batch == 0:
        return
    scale = _resolve_epilogue(api, epilogue_, c, d)
    if m == 0 or n == 0 or k == 0:
        _early_return(m, n, k, d, c)
        return
    desc = _gemm_desc("batched", A, B, d, c, sfa, sfb, recipe, None, None, None)
    if desc is None:
        return
    prod = _ref.mm_nt(_dequant(A, desc["sfa"], m, k), _dequant(B, desc["sfb"], n, k))
    acc = d.to(F64) if c is not None else 0.0
    _store(d, acc + scale * prod)


@public("fp8_bmm")
def fp8_bmm(a, b, d, c=None, recipe=(1, 1, 32), compiled_dims="nk", epilogue=None):
    """csrc/apis/einsum.hpp: D[i] = alpha * A[i] @ B[i]^T (+ D[i] when c is d); A [B, M, K], B [B, N, K] FP8,
    sfA [B, ceil(M / gran_m), ceil(K / 32)], sfB [B, ceil(N / gran_n), ceil(K / 32)]; ``alpha`` from an
    ``epilogue.Alpha`` (1 otherwise)."""
    api = "fp8_bmm"
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    if isinstance(d, (tuple, list)):
        raise NotImplementedError("DeepGEMM stand-in: FP8 output (D, SFD) pairs are not modelled")
    d = _tensor(d, api, "d")
    epilogue = _epilogue_arg(api, epilogue)
    c = _opt_tensor(c, api, "c")
    recipe = _ints(recipe, 3, api, "recipe")
    _fp8_bmm(api, A, sfa, B, sfb, d, c, recipe, epilogue)


def _bf16_bmm(api, a, b, d, c, epilogue_):
    """csrc/apis/einsum.hpp ``bf16_bmm`` after argument conversion (also the target of ``einsum``)."""
    check(a.dtype == BF16, EINSUM, "a.scalar_type() == at::kBFloat16")
    check(b.dtype == BF16, EINSUM, "b.scalar_type() == at::kBFloat16")
    check(d.dtype in (F32, BF16), EINSUM, "d.scalar_type() == at::kFloat or d.scalar_type() == at::kBFloat16")
    scale = _resolve_epilogue(api, epilogue_, c, d)
    desc = _gemm_desc("batched", a, b, d, c, None, None, None, None, None, None)
    if desc is None:
        return
    acc = d.to(F64) if c is not None else 0.0
    _store(d, acc + scale * _ref.mm_nt(a, b))


@public("bf16_bmm")
def bf16_bmm(a, b, d, c=None, compiled_dims="nk", epilogue=None):
    """csrc/apis/einsum.hpp: D[i] = alpha * A[i] @ B[i]^T (+ D[i] when c is d), BF16 operands, D BF16 or FP32."""
    api = "bf16_bmm"
    a = _tensor(a, api, "a")
    b = _tensor(b, api, "b")
    d = _tensor(d, api, "d")
    epilogue = _epilogue_arg(api, epilogue)
    c = _opt_tensor(c, api, "c")
    _bf16_bmm(api, a, b, d, c, epilogue)


# ---------------------------------------------------------------------------------------------------------------------
# Layout utilities and runtime
# ---------------------------------------------------------------------------------------------------------------------


@public("transform_sf_into_required_layout")
def transform_sf_into_required_layout(
    sf, mn, k, recipe, num_groups=None, is_sfa=None, disable_ue8m0_cast=False, psum_layout=None
):
    """csrc/apis/layout.hpp: always returns int16 ``[.., mn, ceil(k / 64)]`` (UE8M0 pairs, MN-major), repeated for
    gran_mn; ``recipe`` must be a 3-tuple."""
    api = "transform_sf_into_required_layout"
    sf = _tensor(sf, api, "sf")
    recipe = _ints(recipe, 3, api, "recipe", optional=False)
    psum_layout = _opt_tensor(psum_layout, api, "psum_layout")
    return _transform_sf(
        sf,
        int(mn),
        int(k),
        recipe,
        None if num_groups is None else int(num_groups),
        None if is_sfa is None else bool(is_sfa),
        bool(disable_ue8m0_cast),
        psum_layout,
    )


@public("transform_k_grouped_sf_into_required_layout")
def transform_k_grouped_sf_into_required_layout(sf, mn, k, recipe, is_sfa, psum_layout):
    api = "transform_k_grouped_sf_into_required_layout"
    return _transform_k_grouped_sf(
        _tensor(sf, api, "sf"),
        int(mn),
        int(k),
        _ints(recipe, 3, api, "recipe", optional=False),
        None if is_sfa is None else bool(is_sfa),
        _tensor(psum_layout, api, "psum_layout"),
    )


@public("get_num_sms")
def get_num_sms():
    return STATE.num_sms or ASCEND_AI_CORES


@public("set_num_sms")
def set_num_sms(n):
    n = int(n)
    check(0 < n <= ASCEND_AI_CORES, JIT, "n > 0 and n <= jit->device.get_num_sms()")
    STATE.num_sms = n


@public("set_npu_arch")
def set_npu_arch(arch):
    STATE.npu_arch = int(arch)


@public("get_npu_arch")
def get_npu_arch():
    return STATE.npu_arch or ASCEND_DEFAULT_NPU_ARCH


@public("set_mk_alignment_for_contiguous_layout")
def set_mk_alignment_for_contiguous_layout(value):
    value = int(value)
    if value != 256:
        fail(JIT, f"mk_alignment is fixed at 256 currently, but attempted to set it to {value}")
    check(value % 64 == 0, JIT, "mk_alignment % 64 == 0")


@public("get_mk_alignment_for_contiguous_layout")
def get_mk_alignment_for_contiguous_layout():
    return STATE.mk_alignment


@public("get_theoretical_mk_alignment_for_contiguous_layout")
def get_theoretical_mk_alignment_for_contiguous_layout():
    return 256


@public("use_deterministic_algorithms")
def use_deterministic_algorithms(enabled):
    STATE.deterministic = bool(enabled)


@public("get_deterministic_algorithms")
def get_deterministic_algorithms():
    return STATE.deterministic


def _exports():
    ex = {}
    for suffix, ta, tb, cd in (
        ("nt", False, False, "nk"),
        ("nn", False, True, "nk"),
        ("tn", True, True, "mn"),
        ("tt", True, False, "mn"),
    ):
        ex[f"fp8_fp4_gemm_{suffix}"] = _make_fp8_fp4_gemm(suffix, ta, tb, cd)
        ex[f"bf16_gemm_{suffix}"] = _make_bf16_gemm(suffix, ta, tb, cd)
        ex[f"fp8_gemm_{suffix}"] = ex[f"fp8_fp4_gemm_{suffix}"]
    for suffix, tb in (("nt", False), ("nn", True)):
        ex[f"m_grouped_fp8_fp4_gemm_{suffix}_contiguous"] = _make_m_grouped_fp8_fp4(suffix, tb)
        ex[f"m_grouped_fp8_gemm_{suffix}_contiguous"] = ex[f"m_grouped_fp8_fp4_gemm_{suffix}_contiguous"]
        ex[f"m_grouped_bf16_gemm_{suffix}_contiguous"] = _make_m_grouped_bf16(suffix, tb)
    ex.update(
        {
            "k_grouped_fp8_gemm_tn_contiguous": k_grouped_fp8_gemm_tn_contiguous,
            "k_grouped_fp8_gemm_nt_contiguous": k_grouped_fp8_gemm_nt_contiguous,
            "k_grouped_bf16_gemm_tn_contiguous": k_grouped_bf16_gemm_tn_contiguous,
            "fp8_bmm": fp8_bmm,
            "bf16_bmm": bf16_bmm,
            "transform_sf_into_required_layout": transform_sf_into_required_layout,
            "transform_k_grouped_sf_into_required_layout": transform_k_grouped_sf_into_required_layout,
            "get_num_sms": get_num_sms,
            "set_num_sms": set_num_sms,
            "set_npu_arch": set_npu_arch,
            "get_npu_arch": get_npu_arch,
            "set_mk_alignment_for_contiguous_layout": set_mk_alignment_for_contiguous_layout,
            "get_mk_alignment_for_contiguous_layout": get_mk_alignment_for_contiguous_layout,
            "get_theoretical_mk_alignment_for_contiguous_layout": get_theoretical_mk_alignment_for_contiguous_layout,
            "use_deterministic_algorithms": use_deterministic_algorithms,
            "get_deterministic_algorithms": get_deterministic_algorithms,
            "epilogue": epilogue,
        }
    )
    stubs = {}
    for suffix in ("nt", "nn", "tn", "tt"):
        stubs[f"aclnn_fp8_fp4_gemm_{suffix}"] = "ACLNN reference GEMM"
        stubs[f"aclnn_bf16_gemm_{suffix}"] = "ACLNN reference GEMM"
        stubs[f"cublaslt_gemm_{suffix}"] = "cuBLASLt alias backed by ACLNN"
    # einsum, fp8_einsum, MQA logits and tf32_hc_prenorm_gemm: _ascend_extra.EXPORTS
    # Mega MoE (SymmBuffer, transform_weights_for_mega_moe, fp8_fp4_mega_moe, deep_gemm.mega): _ascend_mega.EXPORTS
    for name in (
        "get_num_locality_domains",
        "is_localization_available",
        "localize",
        "is_localized",
        "destroy_localizer",
    ):
        stubs[name] = ""
    for name, why in stubs.items():
        ex[name] = not_implemented(name, why=why)
    return ex


EXPORTS = _exports()

#: Names upstream CUDA DeepGEMM exports but DeepGEMM-Ascend does not register: the message the stand-in gives.
ABSENT = {
    "m_grouped_fp8_fp4_gemm_nt_masked": "is not implemented in this backend (DeepGEMM-Ascend csrc/apis/gemm.hpp)",
    "m_grouped_fp8_gemm_nt_masked": "is not implemented in this backend (DeepGEMM-Ascend csrc/apis/gemm.hpp)",
    "m_grouped_bf16_gemm_nt_masked": "is not implemented in this backend (DeepGEMM-Ascend csrc/apis/gemm.hpp)",
    "fp8_m_grouped_gemm_nt_masked": "is not implemented in this backend (DeepGEMM-Ascend csrc/apis/gemm.hpp)",
    "bf16_m_grouped_gemm_nt_masked": "is not implemented in this backend (DeepGEMM-Ascend csrc/apis/gemm.hpp)",
}
