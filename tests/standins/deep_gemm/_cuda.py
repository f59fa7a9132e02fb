"""The "cuda" flavor: DeepGEMM 2.6.1 (deepseek-ai/DeepGEMM @ 54e2261) on SM90 (arch 9) or SM100 (arch 10).

Every host check below is a ``DG_HOST_ASSERT`` / ``DG_HOST_UNREACHABLE`` of that snapshot; the error text quotes the
condition and ``file:line`` (paths relative to the repository root, lines of commit 54e2261). Checks are made in the
same order as upstream, including upstream's side effects before a later check fails (``early_return`` copies ``c``
into ``d`` before the scale factors are transformed). ``Panic`` marks what upstream does *not* check on the host:
device traps (``DG_DEVICE_ASSERT`` / ``DG_TRAP_ONLY_DEVICE_ASSERT``) and silent garbage.
"""

from __future__ import annotations

import torch

from . import _ref
from ._ref import F64, align, ceil_div
from ._standin import DEVICE_SMS, PREFIX, STATE, check, fail, incompatible, not_implemented, panic, public

FP8, FP4, BF16, F32, I32 = torch.float8_e4m3fn, torch.int8, torch.bfloat16, torch.float32, torch.int32
K_MAJOR, MN_MAJOR = "K", "MN"

GEMM = "csrc/apis/gemm.hpp"
LAYOUT_API = "csrc/apis/layout.hpp"
UTILS = "csrc/utils/layout.hpp"
SMXX = "csrc/jit_kernels/impls/smxx_layout.hpp"
CONFIG = "csrc/jit_kernels/heuristics/config.hpp"
RUNTIME_UTILS = "csrc/jit_kernels/impls/runtime_utils.hpp"
SM90_1D2D = "csrc/jit_kernels/impls/sm90_fp8_gemm_1d2d.hpp"
SM90_1D1D = "csrc/jit_kernels/impls/sm90_fp8_gemm_1d1d.hpp"
SM90_BF16 = "csrc/jit_kernels/impls/sm90_bf16_gemm.hpp"
SM100_FP8 = "csrc/jit_kernels/impls/sm100_fp8_fp4_gemm_1d1d.hpp"
SM100_BF16 = "csrc/jit_kernels/impls/sm100_bf16_gemm.hpp"
DEVICE_RUNTIME = "csrc/jit/device_runtime.hpp"


def at(file: str, line: int) -> str:
    return f"{file}:{line}"


# ---------------------------------------------------------------------------------------------------------------------
# Argument conversion (what pybind11 would reject with a TypeError)
# ---------------------------------------------------------------------------------------------------------------------


def _tensor(x, api, arg):
    if not isinstance(x, torch.Tensor):
        incompatible(api, f"'{arg}' must be a torch.Tensor, got {type(x).__name__}")
    return x


def _opt_tensor(x, api, arg):
    return None if x is None else _tensor(x, api, arg)


def _pair(x, api, arg):
    if not (isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x)):
        incompatible(api, f"'{arg}' must be a (Tensor, Tensor) pair")
    return x[0], x[1]


def _ints(x, n, api, arg, optional=True):
    if x is None and optional:
        return None
    ok = isinstance(x, (tuple, list)) and len(x) in ((n,) if isinstance(n, int) else n)
    if ok:
        try:
            return tuple(int(v) for v in x)
        except (TypeError, ValueError):
            pass
    incompatible(api, f"'{arg}' must be a tuple of {n} ints{' or None' if optional else ''}, got {x!r}")


def _ks(x, api):
    if x is None:
        return None
    try:
        return [int(v) for v in x]
    except (TypeError, ValueError):
        incompatible(api, f"'ks_cpu' must be a list of ints or None, got {x!r}")


def _num_sms() -> int:
    return STATE.num_sms or DEVICE_SMS[STATE.arch]


# ---------------------------------------------------------------------------------------------------------------------
# csrc/utils/layout.hpp
# ---------------------------------------------------------------------------------------------------------------------


def _major_check(t):
    check(t.dim() in (2, 3), at(UTILS, 15), "dim == 2 or dim == 3")
    if t.dim() == 3:
        check(t.stride(0) == t.size(-2) * t.size(-1), at(UTILS, 17), "t.stride(0) == t.size(-2) * t.size(-1)")
    check(t.stride(-2) == 1 or t.stride(-1) == 1, at(UTILS, 18), "t.stride(-2) == 1 or t.stride(-1) == 1")


def _major_ab(t):
    _major_check(t)
    return K_MAJOR if t.stride(-1) == 1 else MN_MAJOR


def _check_cd(t):
    _major_check(t)
    check(t.stride(-1) == 1, at(UTILS, 29), "t.stride(-1) == 1")


def _shape(t, n):
    check(t.dim() == n, at(UTILS, 39), "t.dim() == N")
    return tuple(int(s) for s in t.shape)


def _check_ab_fp8_fp4(ab, major, arch):
    mn, k = _shape(ab, 2)
    if ab.dtype != FP8:
        check(ab.dtype == FP4 and arch == 10, at(UTILS, 48), "ab.scalar_type() == kPackedFP4 and arch_major == 10")
        if major == K_MAJOR:
            k *= 2
        else:
            mn *= 2
    return mn, k


def _check_grouped_ab_fp8_fp4(ab, major, arch):
    g, mn, k = _shape(ab, 3)
    if ab.dtype != FP8:
        check(ab.dtype == FP4 and arch == 10, at(UTILS, 57), "ab.scalar_type() == kPackedFP4 and arch_major == 10")
        if major == K_MAJOR:
            k *= 2
        else:
            mn *= 2
    return g, mn, k


def _default_recipe(sfa_dtype, sfb_dtype):
    if STATE.arch == 9:
        check(
            sfa_dtype == F32 and sfb_dtype == F32,
            at(UTILS, 68),
            "sfa_dtype == torch::kFloat and sfb_dtype == torch::kFloat",
        )
        return (1, 128, 128)
    check(sfb_dtype in (F32, I32), at(UTILS, 71), "sfb_dtype == torch::kFloat or sfb_dtype == torch::kInt")
    return (1, 128, 128) if sfb_dtype == F32 else (1, 1, 128)


def _check_sf_layout(
    sf, mn, k, gran_mn, gran_k, num_groups, tma_stride_check=False, sm90_sfb_check=False, type_check=None
):
    if type_check is not None:
        check(sf.dtype == type_check, at(UTILS, 89), "sf.scalar_type() == type_check.value()")
    check(sf.dtype in (F32, I32), at(UTILS, 93), "sf_dtype == torch::kFloat or sf_dtype == torch::kInt")
    check(
        sf.dim() == int(num_groups is not None) + 2,
        at(UTILS, 94),
        "sf.dim() == static_cast<int>(num_groups.has_value()) + 2",
    )
    if num_groups is not None:
        check(sf.size(-3) == num_groups, at(UTILS, 96), "sf.size(-3) == num_groups.value()")
    check(sf.size(-2) == ceil_div(mn, gran_mn), at(UTILS, 97), "sf.size(-2) == ceil_div(mn, gran_mn)")
    check(
        sf.size(-1) == ceil_div(k, gran_k * (1 if sf.dtype == F32 else 4)),
        at(UTILS, 98),
        "sf.size(-1) == ceil_div(k, gran_k * (sf_dtype == torch::kFloat ? 1 : 4))",
    )
    if tma_stride_check:
        if num_groups is not None:
            check(
                sf.stride(-3) == sf.stride(-1) * sf.size(-1),
                at(UTILS, 103),
                "sf.stride(-3) == sf.stride(-1) * sf.size(-1)",
            )
        check(sf.stride(-2) == 1 or mn == 1, at(UTILS, 105), "sf.stride(-2) == 1 or mn == 1")
        check(
            sf.stride(-1) == _tma_aligned_size(mn, sf.element_size()),
            at(UTILS, 106),
            "sf.stride(-1) == get_tma_aligned_size(mn, sf.element_size())",
        )
    if sm90_sfb_check:
        if num_groups is not None:
            check(
                sf.stride(-3) == sf.size(-2) * sf.size(-1), at(UTILS, 112), "sf.stride(-3) == sf.size(-2) * sf.size(-1)"
            )
        check(
            (sf.stride(-1) == 1 and sf.stride(-2) == sf.size(-1))
            or (sf.stride(-1) == sf.size(-2) and sf.stride(-2) == 1),
            at(UTILS, 113),
            "(sf.stride(-1) == 1 and sf.stride(-2) == sf.size(-1)) or "
            "(sf.stride(-1) == sf.size(-2) and sf.stride(-2) == 1)",
        )
    return sf


# ---------------------------------------------------------------------------------------------------------------------
# csrc/utils/math.hpp + csrc/jit_kernels/impls/smxx_layout.hpp (scale-factor layouts)
# ---------------------------------------------------------------------------------------------------------------------


def _tma_aligned_size(x, element_size):
    check(16 % element_size == 0, "csrc/utils/math.hpp:25", "kNumTMAAlignmentBytes % element_size == 0")
    return align(x, 16 // element_size)


def _preprocess_sf(sf):
    check(sf.dim() in (2, 3), at(SMXX, 111), "dim == 2 or dim == 3")
    check(sf.dtype == F32, at(SMXX, 112), "sf.scalar_type() == torch::kFloat")
    b = sf.unsqueeze(0) if sf.dim() == 2 else sf
    nb, mn, sf_k = (int(s) for s in b.shape)
    return sf.dim(), nb, mn, sf_k, _tma_aligned_size(mn, 4), b


def _mn_major_tma_aligned(sf):
    dim, nb, mn, sf_k, tmn, b = _preprocess_sf(sf)
    if (b.stride(0) == tmn * sf_k or dim == 2) and b.stride(1) == 1 and b.stride(2) == tmn:
        return sf
    out = torch.empty_strided((nb, mn, sf_k), (tmn * sf_k, 1, tmn), dtype=F32)
    out.copy_(b)
    return out.squeeze(0) if dim == 2 else out


def _psum_valid_rows(psum_layout, mn):
    """Rows inside some group ``[align(end_{g-1}, alignment), end_g)`` (the SFA pack kernel skips the others)."""
    valid = torch.zeros(mn, dtype=torch.bool)
    ends = psum_layout.tolist()
    alignment = STATE.mk_alignment
    for g, end in enumerate(ends):
        start = 0 if g == 0 else align(max(ends[g - 1], 0), alignment)
        lo, hi = max(start, 0), min(max(end, 0), mn)
        if lo < hi:
            valid[lo:hi] = True
    return valid


def _ue8m0_panic_at(value, index, where_kernel, what="FP32 scale factors"):
    panic(
        f"{what} must have a zero sign and mantissa (positive powers of two) to be cast to UE8M0, but element "
        f"{index} is {value!r}. The real library would trap on the device "
        f"(DG_DEVICE_ASSERT((values[j] & 0x807fffffu) == 0) in {where_kernel}, "
        f"deep_gemm/include/deep_gemm/impls/smxx_layout.cuh) or, on its PyTorch fallback path, silently reduce "
        f"each scale to its exponent."
    )


def _ue8m0_panic(sf_vals, bad, where_kernel):
    idx = tuple(int(i) for i in bad.nonzero()[0])
    _ue8m0_panic_at(float(sf_vals[idx]), list(idx), where_kernel)


def _packed_ue8m0(sf, psum_layout=None):
    """``get_mn_major_tma_aligned_packed_ue8m0_tensor``: FP32 ``[.., mn, sf_k]`` -> int32 ``[.., mn, ceil(sf_k/4)]``,
    MN-major with the MN stride TMA-aligned."""
    dim, nb, mn, sf_k, tmn, b = _preprocess_sf(sf)
    packed_sf_k = ceil_div(sf_k, 4)
    use_psum = psum_layout is not None
    if use_psum:
        check(nb == 1 and b.is_contiguous(), at(SMXX, 191), "num_sf_batches == 1 and batched_sf.is_contiguous()")
        check(
            psum_layout.dtype == I32 and psum_layout.is_contiguous(),
            at(SMXX, 192),
            "psum_layout->scalar_type() == torch::kInt and psum_layout->is_contiguous()",
        )
        check(psum_layout.numel() > 0, at(SMXX, 193), "psum_layout->numel() > 0")
    if b.is_contiguous():
        where = (
            "transpose_and_pack_fp32_into_ue8m0"
            if not ((mn * sf_k) % 4 != 0 and nb > 1)
            else "get_mn_major_tma_aligned_packed_ue8m0_tensor_torch"
        )
    else:
        check(not use_psum, at(SMXX, 224), "not use_psum_layout")
        if mn % 4 != 0 or nb > 1:
            where = "get_mn_major_tma_aligned_packed_ue8m0_tensor_torch"
        else:
            check(
                b.stride(1) == 1 and b.stride(2) == mn,
                at(SMXX, 227),
                "batched_sf.stride(1) == 1 and batched_sf.stride(2) == mn",
            )
            where = "pack_fp32_into_ue8m0"
    codes, exact = _ref.fp32_codes(b)
    rows = _psum_valid_rows(psum_layout, mn) if use_psum else torch.ones(mn, dtype=torch.bool)
    bad = ~exact & rows.view(1, mn, 1)
    if bool(bad.any()):
        _ue8m0_panic(b[0] if dim == 2 else b, bad[0] if dim == 2 else bad, where)
    codes = torch.where(rows.view(1, mn, 1), codes, torch.zeros_like(codes))
    words = _ref.pack_bytes(_ref.pad_last(codes, packed_sf_k * 4), 4)
    out = torch.empty_strided((nb, mn, packed_sf_k), (packed_sf_k * tmn, 1, tmn), dtype=I32)
    out.copy_(words.to(I32))
    return out.squeeze(0) if dim == 2 else out


def _transform_sf(sf, mn, k, recipe, num_groups, is_sfa, disable_ue8m0_cast, psum_layout=None):
    """``layout::transform_sf_into_required_layout``; returns (tensor the kernel reads, its gran_mn, gran_k)."""
    arch = STATE.arch
    if len(recipe) == 3:
        check(is_sfa is not None, at(LAYOUT_API, 27), "is_sfa.has_value()")
        gran_mn = recipe[0] if is_sfa else recipe[1]
        gran_k = recipe[2]
    else:
        check(is_sfa is None, at(LAYOUT_API, 31), "not is_sfa.has_value()")
        gran_mn, gran_k = recipe
    _check_sf_layout(sf, mn, k, gran_mn, gran_k, num_groups)
    if sf.dtype == F32 and gran_mn == 1 and gran_k == 128 and (arch == 9 or disable_ue8m0_cast):
        return _mn_major_tma_aligned(sf), 1, 128
    if sf.dtype == F32 and gran_mn == 128 and gran_k == 128 and (arch == 9 or disable_ue8m0_cast):
        return _check_sf_layout(sf, mn, k, gran_mn, gran_k, num_groups, False, True, F32), 128, 128
    if sf.dtype == F32 and gran_k in (32, 128) and arch == 10:
        check(not disable_ue8m0_cast, at(LAYOUT_API, 50), "not disable_ue8m0_cast")
        broadcasted = sf if gran_mn == 1 else sf.index_select(-2, torch.arange(mn).floor_divide_(gran_mn))
        return _packed_ue8m0(broadcasted, psum_layout), 1, gran_k
    if sf.dtype == I32 and gran_mn == 1 and gran_k in (32, 128) and arch == 10:
        return _check_sf_layout(sf, mn, k, gran_mn, gran_k, num_groups, True, False, I32), 1, gran_k
    fail(at(LAYOUT_API, 60), "Unknown SF transformation")


class _SF:
    """A transformed scale-factor tensor as the kernel reads it."""

    def __init__(self, t, gran_mn, gran_k):
        self.t, self.gran_mn, self.gran_k = t, gran_mn, gran_k

    def block_values(self):
        if self.t.dtype == F32:
            return self.t.to(F64)
        return _ref.ue8m0_values(_ref.unpack_bytes(self.t, 4))

    def element_values(self, mn, k):
        return _ref.expand_scales(self.block_values(), mn, k, self.gran_mn, self.gran_k)


def _transform_pair(sfa, sfb, m, n, k, recipe, recipe_a, recipe_b, ng_a, ng_b, disable_ue8m0_cast, psum=None):
    """``layout::transform_sf_pair_into_required_layout`` (csrc/apis/layout.hpp:63-90)."""
    if recipe_a is None and recipe is None:
        recipe = _default_recipe(sfa.dtype, sfb.dtype)
    check(
        (recipe_a is not None) == (recipe_b is not None),
        at(LAYOUT_API, 79),
        "recipe_a.has_value() == recipe_b.has_value()",
    )
    check(
        (recipe_a is not None) != (recipe is not None), at(LAYOUT_API, 80), "recipe_a.has_value() != recipe.has_value()"
    )
    if recipe is not None:
        ta = _transform_sf(sfa, m, k, recipe, ng_a, True, disable_ue8m0_cast, psum)
        tb = _transform_sf(sfb, n, k, recipe, ng_b, False, disable_ue8m0_cast)
    else:
        ta = _transform_sf(sfa, m, k, recipe_a, ng_a, None, disable_ue8m0_cast, psum)
        tb = _transform_sf(sfb, n, k, recipe_b, ng_b, None, disable_ue8m0_cast)
    return _SF(*ta), _SF(*tb), recipe


# ---------------------------------------------------------------------------------------------------------------------
# Kernel-launch host checks: heuristics (GemmDesc::check_validity) and TMA descriptors
# ---------------------------------------------------------------------------------------------------------------------


def _check_validity(a_dtype, b_dtype, cd_dtype):
    if a_dtype == BF16:
        check(
            a_dtype == BF16 and b_dtype == BF16,
            at(CONFIG, 41),
            "a_dtype == torch::kBFloat16 and b_dtype == torch::kBFloat16",
        )
    else:
        check(a_dtype in (FP8, FP4), at(CONFIG, 43), "a_dtype == torch::kFloat8_e4m3fn or a_dtype == kPackedFP4")
        check(b_dtype in (FP8, FP4), at(CONFIG, 44), "b_dtype == torch::kFloat8_e4m3fn or b_dtype == kPackedFP4")
    check(cd_dtype in (BF16, F32), at(CONFIG, 46), "cd_dtype == torch::kBFloat16 or cd_dtype == torch::kFloat")
    check(_num_sms() % 2 == 0, at(CONFIG, 47), "num_sms % 2 == 0")


def _tma(t, outer_stride, what, inner_dim=None):
    """``make_tma_2d_desc``: the FP4 inner-dim check, then ``cuTensorMapEncodeTiled``'s documented requirements
    (16-byte aligned global address, global strides a multiple of 16 bytes), which upstream surfaces through
    ``DG_CUDA_DRIVER_CHECK`` as a "CUDA driver error"."""
    if t.dtype == FP4 and inner_dim is not None:
        check(inner_dim % 128 == 0, at(RUNTIME_UTILS, 126), "not fp4_unpacked_smem or gmem_inner_dim % 128 == 0")
    nbytes = int(outer_stride) * t.element_size()
    if t.data_ptr() % 16 != 0 or nbytes % 16 != 0:
        raise RuntimeError(
            f"{PREFIX}CUDA driver error ({RUNTIME_UTILS} make_tma_2d_desc -> cuTensorMapEncodeTiled): "
            f"CUDA_ERROR_INVALID_VALUE for the TMA descriptor of {what}: requires globalAddress % 16 == 0 and "
            f"globalStrides[0] % 16 == 0 (address % 16 = {t.data_ptr() % 16}, outer stride = {nbytes} bytes)"
        )


def _tma_ab(t, major, mn, k, what):
    """``make_tma_a_desc`` / ``make_tma_b_desc`` with upstream's usual outer stride ``t.stride(non-contiguous)``."""
    _tma(t, t.stride(-2 if major == K_MAJOR else -1), what, k if major == K_MAJOR else mn)


def _sm90_1d2d_n_trap(n):
    if n % 8 != 0:
        panic(
            f"shape_n = {n} is not a multiple of 8: the SM90 1D2D kernel traps on the device "
            f"(DG_TRAP_ONLY_DEVICE_ASSERT(shape_n % 8 == 0), "
            f"deep_gemm/include/deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh:231)"
        )


def _operand(t, major):
    """float64 logical values; a packed FP4 operand is unpacked along its contiguous dim."""
    return _ref.operand_values(t, -1 if major == K_MAJOR else -2)


# ---------------------------------------------------------------------------------------------------------------------
# Shared GEMM pieces
# ---------------------------------------------------------------------------------------------------------------------


def _early_return(m, n, k, d, c):
    if m == 0 or n == 0:
        return True
    is_cd_same = c is not None and c.data_ptr() == d.data_ptr()
    if is_cd_same:
        check(
            c.shape == d.shape and c.stride() == d.stride(),
            at(GEMM, 28),
            "c->sizes() == d.sizes() and c->strides() == d.strides()",
        )
    check(
        d.dtype in (BF16, F32), at(GEMM, 29), "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat"
    )
    if c is not None:
        _check_cd(c)
        check(d.dtype == c.dtype, at(GEMM, 32), "d.scalar_type() == c.value().scalar_type()")
    if k == 0:
        if not is_cd_same:
            d.copy_(c) if c is not None else d.zero_()
        return True
    if c is not None and not is_cd_same:
        d.copy_(c)
    return False


def _check_k_grouped_args(ks_cpu, grouped_layout, num_groups, use_psum_layout, k_alignment, sum_k_if_missing=0):
    check(grouped_layout.is_contiguous(), at(GEMM, 54), "grouped_layout.is_contiguous()")
    check(grouped_layout.dtype == I32, at(GEMM, 55), "grouped_layout.scalar_type() == torch::kInt")
    check(grouped_layout.numel() == num_groups, at(GEMM, 56), "static_cast<int>(grouped_layout.numel()) == num_groups")
    if ks_cpu:
        check(len(ks_cpu) == num_groups, at(GEMM, 59), "static_cast<int>(ks_cpu.value().size()) == num_groups")
        for kk in ks_cpu:
            check(kk % k_alignment == 0, at(GEMM, 62), "k % k_alignment == 0")
        return sum(ks_cpu)
    check(use_psum_layout, at(GEMM, 67), "use_psum_layout")
    return sum_k_if_missing


def _store(dst, value):
    dst.copy_(value.to(dst.dtype))


def _m_grouped_write(d, a_deq, b_deq, grouped_layout, use_psum_layout, zero_gap_rows):
    """Kernel-side semantics of the m-grouped contiguous GEMMs (both layouts), with the stand-in's padding rule:
    id-layout ``-1`` rows are written 0; psum gap rows ``[end_g, align(end_g, alignment))`` are written 0 when
    ``zero_gap_rows`` (SM100 ``ensure_zero_padding=True``) and left untouched otherwise; rows after the last group's
    aligned end are never touched."""
    m = a_deq.shape[0]
    num_groups = b_deq.shape[0]
    alignment = STATE.mk_alignment
    vals = grouped_layout.tolist()
    if use_psum_layout:
        prev_end = 0
        for g, end in enumerate(vals):
            start = 0 if g == 0 else align(prev_end, alignment)
            if end < start:
                panic(
                    f"psum grouped_layout[{g}] = {end} is smaller than the group's start {start} "
                    f"(= align(grouped_layout[{g - 1}], {alignment})): the scheduler computes the group's M as an "
                    f"unsigned {end} - {start} and walks far past the tensors"
                )
            if end > m:
                panic(
                    f"psum grouped_layout[{g}] = {end} exceeds M = {m}: the kernel indexes rows past the end of "
                    f"A/D (TMA clips them; those rows are silently dropped)"
                )
            prev_end = end
        prev_end = 0
        for g, end in enumerate(vals):
            start = 0 if g == 0 else align(prev_end, alignment)
            if end > start:
                _store(d[start:end], _ref.mm_nt(a_deq[start:end], b_deq[g]))
            gap_end = min(align(end, alignment), m)
            if zero_gap_rows and gap_end > end:
                d[end:gap_end].zero_()
            prev_end = end
        return
    bad = [(i, v) for i, v in enumerate(vals) if v < -1 or v >= num_groups]
    if bad:
        i, v = bad[0]
        panic(
            f"grouped_layout[{i}] = {v} is neither -1 nor a group index in [0, {num_groups}): the kernel reads "
            f"B of a group that does not exist"
        )
    for t0 in range(0, m, alignment):
        tile = vals[t0 : t0 + alignment]
        first = tile[0]
        for j, v in enumerate(tile):
            if v >= 0 and v != first:
                panic(
                    f"rows {t0}..{t0 + len(tile) - 1} form one BLOCK_M = {alignment} tile "
                    f"(get_mk_alignment_for_contiguous_layout()), but grouped_layout[{t0 + j}] = {v} differs from "
                    f"the tile's first entry {first}: the kernel takes the group of a whole tile from its first "
                    f"row, so those rows would be multiplied with the wrong expert's weights"
                )
    ids = torch.tensor(vals, dtype=torch.int64)
    for g in sorted(set(v for v in vals if v >= 0)):
        rows = (ids == g).nonzero().flatten()
        d[rows] = _ref.mm_nt(a_deq[rows], b_deq[g]).to(d.dtype)
    pad = (ids == -1).nonzero().flatten()
    if pad.numel():
        d[pad] = torch.zeros((pad.numel(), d.shape[1]), dtype=d.dtype)


def _masked_write(d, a_deq, b_deq, masked_m):
    m = a_deq.shape[1]
    for g, mm in enumerate(masked_m.tolist()):
        if mm < 0 or mm > m:
            panic(
                f"masked_m[{g}] = {mm} is outside [0, M = {m}]: the kernel reads and writes rows of the next "
                f"group (A and D are folded into [G * M, ...] TMA descriptors)"
            )
        if mm:
            _store(d[g, :mm], _ref.mm_nt(a_deq[g, :mm], b_deq[g]))


# ---------------------------------------------------------------------------------------------------------------------
# FP8/FP4 GEMMs
# ---------------------------------------------------------------------------------------------------------------------


def _fp8_fp4_gemm_nt(api, a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast):
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    d = _tensor(d, api, "d")
    c = _opt_tensor(c, api, "c")
    recipe = _ints(recipe, 3, api, "recipe")
    recipe_a = _ints(recipe_a, 2, api, "recipe_a")
    recipe_b = _ints(recipe_b, 2, api, "recipe_b")
    arch = STATE.arch

    major_a, major_b = _major_ab(A), _major_ab(B)
    if arch == 9:  # fp8_requires_k_major()
        check(major_a == K_MAJOR, at(GEMM, 86), "major_a == cute::UMMA::Major::K")
        check(major_b == K_MAJOR, at(GEMM, 87), "major_b == cute::UMMA::Major::K")
    _check_cd(d)
    m, k = _check_ab_fp8_fp4(A, major_a, arch)
    n, k_ = _check_ab_fp8_fp4(B, major_b, arch)
    m_, n_ = _shape(d, 2)
    check(m == m_ and n == n_ and k == k_, at(GEMM, 98), "m == m_ and n == n_ and k == k_")
    check(
        d.dtype in (BF16, F32), at(GEMM, 99), "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat"
    )
    if _early_return(m, n, k, d, c):
        return
    tsfa, tsfb, recipe = _transform_pair(sfa, sfb, m, n, k, recipe, recipe_a, recipe_b, None, None, disable_ue8m0_cast)

    if arch == 9 and tsfa.t.dtype == F32:
        gran_n = recipe[1] if recipe is not None else recipe_b[0]
        if gran_n == 1:
            # sm90_fp8_gemm_1d1d
            check(
                c is not None and d.dtype == F32,
                at(SM90_1D1D, 85),
                "c.has_value() and d.scalar_type() == torch::kFloat",
            )
            check(
                major_a == K_MAJOR and major_b == K_MAJOR,
                at(SM90_1D1D, 86),
                "major_a == cute::UMMA::Major::K and major_b == cute::UMMA::Major::K",
            )
            _check_validity(A.dtype, B.dtype, d.dtype)
            for t, name in ((A, "A"), (B, "B")):
                if t.stride(-2) != k:
                    panic(
                        f"{name} has row stride {t.stride(-2)} != K = {k}: sm90_fp8_gemm_1d1d builds the TMA "
                        f"descriptor of {name} with outer stride K ({SM90_1D1D}:105-112), so it would read the "
                        f"wrong rows"
                    )
            _tma(A, k, "A")
            _tma(B, k, "B")
            _tma(d, d.stride(-2), "D")
        else:
            _major_ab(tsfb.t)  # major_sfb = get_major_type_ab(sfb)
            check(
                c is None and d.dtype == BF16,
                at(SM90_1D2D, 89),
                "not c.has_value() and d.scalar_type() == torch::kBFloat16",
            )
            check(
                major_a == K_MAJOR and major_b == K_MAJOR,
                at(SM90_1D2D, 90),
                "major_a == cute::UMMA::Major::K and major_b == cute::UMMA::Major::K",
            )
            _check_validity(A.dtype, B.dtype, d.dtype)
            _tma_ab(A, major_a, m, k, "A")
            _tma_ab(B, major_b, n, k, "B")
            _tma(d, d.stride(-2), "D")
            _sm90_1d2d_n_trap(n)
        if tsfa.gran_mn != 1:
            panic(
                f"the SM90 FP8 kernels read SFA per row (TMA, MN-major), but the recipe gives SFA a granularity of "
                f"{tsfa.gran_mn} rows: the kernel would read past the {tsfa.t.size(-2)} scale rows"
            )
    elif arch == 10 and tsfa.t.dtype == I32:
        if tsfb.t.dtype != I32:
            panic(
                "SFA was packed to UE8M0 (int32) but SFB stayed FP32 (disable_ue8m0_cast=True): the SM100 kernel "
                "reads SFB as packed UE8M0 words"
            )
        _check_validity(A.dtype, B.dtype, d.dtype)
        _tma_ab(A, major_a, m, k, "A")
        _tma_ab(B, major_b, n, k, "B")
        _tma(d, d.stride(-2), "D")
    else:
        fail(at(GEMM, 122), "Unsupported architecture or scaling factor types")

    a_deq = _operand(A, major_a) * tsfa.element_values(m, k)
    b_deq = _operand(B, major_b) * tsfb.element_values(n, k)
    acc = d.to(F64) if c is not None else 0.0
    _store(d, acc + _ref.mm_nt(a_deq, b_deq))


def _t01(t):
    return t.transpose(0, 1)


@public("fp8_fp4_gemm_nt")
def fp8_fp4_gemm_nt(
    a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk", disable_ue8m0_cast=False
):
    """D = C + A @ B^T with A [M, K], B [N, K] (FP8 E4M3 or SM100 packed FP4) and their scale factors."""
    _fp8_fp4_gemm_nt("fp8_fp4_gemm_nt", a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


@public("fp8_fp4_gemm_nn")
def fp8_fp4_gemm_nn(
    a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk", disable_ue8m0_cast=False
):
    """B given as [K, N] (gemm.hpp:126-137: B and SFB transposed, then the NT path)."""
    B, sfb = _pair(b, "fp8_fp4_gemm_nn", "b")
    _fp8_fp4_gemm_nt(
        "fp8_fp4_gemm_nn", a, (_t01(B), _t01(sfb)), d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast
    )


@public("fp8_fp4_gemm_tn")
def fp8_fp4_gemm_tn(
    a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="mn", disable_ue8m0_cast=False
):
    """A given as [K, M], B as [K, N] (gemm.hpp:139-151)."""
    A, sfa = _pair(a, "fp8_fp4_gemm_tn", "a")
    B, sfb = _pair(b, "fp8_fp4_gemm_tn", "b")
    _fp8_fp4_gemm_nt(
        "fp8_fp4_gemm_tn",
        (_t01(A), _t01(sfa)),
        (_t01(B), _t01(sfb)),
        d,
        c,
        recipe,
        recipe_a,
        recipe_b,
        compiled_dims,
        disable_ue8m0_cast,
    )


@public("fp8_fp4_gemm_tt")
def fp8_fp4_gemm_tt(
    a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="mn", disable_ue8m0_cast=False
):
    """A given as [K, M] (gemm.hpp:153-164)."""
    A, sfa = _pair(a, "fp8_fp4_gemm_tt", "a")
    _fp8_fp4_gemm_nt(
        "fp8_fp4_gemm_tt", (_t01(A), _t01(sfa)), b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast
    )


def _m_grouped_fp8_fp4_nt(
    api,
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
):
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    d = _tensor(d, api, "d")
    grouped_layout = _tensor(grouped_layout, api, "grouped_layout")
    recipe = _ints(recipe, 3, api, "recipe")
    recipe_a = _ints(recipe_a, 2, api, "recipe_a")
    recipe_b = _ints(recipe_b, 2, api, "recipe_b")
    arch = STATE.arch

    major_a, major_b = _major_ab(A), _major_ab(B)
    check(major_a == K_MAJOR, at(GEMM, 181), "major_a == cute::UMMA::Major::K")
    if arch == 9:
        check(major_b == K_MAJOR, at(GEMM, 183), "major_b == cute::UMMA::Major::K")
    check(grouped_layout.is_contiguous(), at(GEMM, 184), "grouped_layout.is_contiguous()")
    m, k = _check_ab_fp8_fp4(A, major_a, arch)
    num_groups, n, k_ = _check_grouped_ab_fp8_fp4(B, major_b, arch)
    m_, n_ = _shape(d, 2)
    check(m == m_ and n == n_ and k == k_, at(GEMM, 191), "m == m_ and n == n_ and k == k_")
    check(n > 0 and k > 0 and num_groups > 0, at(GEMM, 192), "n > 0 and k > 0 and num_groups > 0")
    check(d.dtype == BF16, at(GEMM, 193), "d.scalar_type() == torch::kBFloat16")
    check(grouped_layout.dtype == I32, at(GEMM, 194), "grouped_layout.scalar_type() == torch::kInt")
    if use_psum_layout:
        (num_groups_,) = _shape(grouped_layout, 1)
        check(num_groups == num_groups_, at(GEMM, 199), "num_groups == num_groups_")
    else:
        (m__,) = _shape(grouped_layout, 1)
        check(m == m__, at(GEMM, 202), "m == m__")
        check(expected_m_for_psum_layout is None, at(GEMM, 203), "not expected_m_for_psum_layout.has_value()")
    _check_cd(d)
    if m == 0:
        return
    tsfa, tsfb, recipe = _transform_pair(
        sfa,
        sfb,
        m,
        n,
        k,
        recipe,
        recipe_a,
        recipe_b,
        None,
        num_groups,
        disable_ue8m0_cast,
        grouped_layout if use_psum_layout else None,
    )

    if arch == 9 and tsfa.t.dtype == F32:
        _major_ab(tsfb.t)
        # sm90_m_grouped_fp8_gemm_contiguous_1d2d
        check(d.dtype == BF16, at(SM90_1D2D, 156), "d.scalar_type() == torch::kBFloat16")
        check(
            major_a == K_MAJOR and major_b == K_MAJOR,
            at(SM90_1D2D, 157),
            "major_a == cute::UMMA::Major::K and major_b == cute::UMMA::Major::K",
        )
        if expected_m_for_psum_layout is not None:
            check(use_psum_layout, at(SM90_1D2D, 164), "use_psum_layout")
        _check_validity(A.dtype, B.dtype, d.dtype)
        _tma_ab(A, major_a, m, k, "A")
        _tma_ab(B, major_b, n, k, "B")
        _tma(d, d.stride(-2), "D")
        _sm90_1d2d_n_trap(n)
        if tsfa.gran_mn != 1 or tsfb.gran_mn != 128:
            panic(
                f"the SM90 m-grouped GEMM always runs the 1D2D kernel (per-row SFA, 128x128-block SFB), but the "
                f"recipe gives SFA/SFB row granularities {tsfa.gran_mn}/{tsfb.gran_mn}: the scales would be misread"
            )
        zero_gaps = False  # SM90 ignores ensure_zero_padding
    elif arch == 10 and tsfa.t.dtype == I32:
        if tsfb.t.dtype != I32:
            panic(
                "SFA was packed to UE8M0 (int32) but SFB stayed FP32 (disable_ue8m0_cast=True): the SM100 kernel "
                "reads SFB as packed UE8M0 words"
            )
        if expected_m_for_psum_layout is not None:
            check(use_psum_layout, at(SM100_FP8, 177), "use_psum_layout")
        _check_validity(A.dtype, B.dtype, d.dtype)
        _tma_ab(A, major_a, m, k, "A")
        _tma_ab(B, major_b, n, k, "B")
        _tma(d, d.stride(-2), "D")
        zero_gaps = bool(ensure_zero_padding)
    else:
        fail(at(GEMM, 230), "Unsupported architecture or scaling factor types")

    a_deq = _operand(A, major_a) * tsfa.element_values(m, k)
    b_deq = _operand(B, major_b) * tsfb.element_values(n, k)
    _m_grouped_write(d, a_deq, b_deq, grouped_layout, use_psum_layout, zero_gaps)


@public("m_grouped_fp8_fp4_gemm_nt_contiguous")
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
):
    """A [M, K] (experts' rows concatenated), B [G, N, K], D [M, N] BF16; ``grouped_layout`` is per-row expert ids
    (``-1`` = padding) or, with ``use_psum_layout``, the G cumulative group ends."""
    _m_grouped_fp8_fp4_nt(
        "m_grouped_fp8_fp4_gemm_nt_contiguous",
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
    )


@public("m_grouped_fp8_fp4_gemm_nn_contiguous")
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
):
    """B given as [G, K, N] (gemm.hpp:234-248)."""
    api = "m_grouped_fp8_fp4_gemm_nn_contiguous"
    B, sfb = _pair(b, api, "b")
    _m_grouped_fp8_fp4_nt(
        api,
        a,
        (B.transpose(1, 2), sfb.transpose(1, 2)),
        d,
        grouped_layout,
        recipe,
        recipe_a,
        recipe_b,
        compiled_dims,
        disable_ue8m0_cast,
        use_psum_layout,
        ensure_zero_padding,
        None,
    )


@public("m_grouped_fp8_fp4_gemm_nt_masked")
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
):
    """A [G, M_max, K], B [G, N, K], D [G, M_max, N] BF16; rows ``i < masked_m[g]`` computed, the rest untouched."""
    api = "m_grouped_fp8_fp4_gemm_nt_masked"
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    d = _tensor(d, api, "d")
    masked_m = _tensor(masked_m, api, "masked_m")
    expected_m = int(expected_m)
    recipe = _ints(recipe, 3, api, "recipe")
    recipe_a = _ints(recipe_a, 2, api, "recipe_a")
    recipe_b = _ints(recipe_b, 2, api, "recipe_b")
    arch = STATE.arch

    major_a, major_b = _major_ab(A), _major_ab(B)
    check(
        major_a == K_MAJOR and major_b == K_MAJOR,
        at(GEMM, 263),
        "major_a == cute::UMMA::Major::K and major_b == cute::UMMA::Major::K",
    )
    check(masked_m.is_contiguous(), at(GEMM, 264), "masked_m.is_contiguous()")
    num_groups, m, k = _check_grouped_ab_fp8_fp4(A, major_a, arch)
    num_groups_, n, k_ = _check_grouped_ab_fp8_fp4(B, major_b, arch)
    num_groups__, m_, n_ = _shape(d, 3)
    num_groups___ = masked_m.numel()
    check(
        num_groups == num_groups_ and num_groups == num_groups__ and num_groups == num_groups___,
        at(GEMM, 272),
        "num_groups == num_groups_ and num_groups == num_groups__ and num_groups == num_groups___",
    )
    check(m == m_ and n == n_ and k == k_, at(GEMM, 273), "m == m_ and n == n_ and k == k_")
    check(
        expected_m > 0 and m > 0 and n > 0 and k > 0 and num_groups > 0,
        at(GEMM, 274),
        "expected_m > 0 and m > 0 and n > 0 and k > 0 and num_groups > 0",
    )
    check(d.dtype == BF16, at(GEMM, 275), "d.scalar_type() == torch::kBFloat16")
    check(masked_m.dtype == I32, at(GEMM, 276), "masked_m.scalar_type() == torch::kInt")
    _check_cd(d)
    tsfa, tsfb, recipe = _transform_pair(
        sfa, sfb, m, n, k, recipe, recipe_a, recipe_b, num_groups, num_groups, disable_ue8m0_cast
    )
    if arch == 9 and tsfa.t.dtype == F32:
        _major_ab(tsfb.t)
        check(d.dtype == BF16, at(SM90_1D2D, 232), "d.scalar_type() == torch::kBFloat16")
        check(
            major_a == K_MAJOR and major_b == K_MAJOR,
            at(SM90_1D2D, 233),
            "major_a == cute::UMMA::Major::K and major_b == cute::UMMA::Major::K",
        )
        _check_validity(A.dtype, B.dtype, d.dtype)
        _tma_ab(A, major_a, m, k, "A")
        _tma_ab(B, major_b, n, k, "B")
        _tma(d, d.stride(-2), "D")
        _sm90_1d2d_n_trap(n)
        if tsfa.gran_mn != 1 or tsfb.gran_mn != 128:
            panic(
                f"the SM90 masked GEMM always runs the 1D2D kernel (per-row SFA, 128x128-block SFB), but the "
                f"recipe gives SFA/SFB row granularities {tsfa.gran_mn}/{tsfb.gran_mn}: the scales would be misread"
            )
    elif arch == 10 and tsfa.t.dtype == I32:
        if tsfb.t.dtype != I32:
            panic(
                "SFA was packed to UE8M0 (int32) but SFB stayed FP32 (disable_ue8m0_cast=True): the SM100 kernel "
                "reads SFB as packed UE8M0 words"
            )
        _check_validity(A.dtype, B.dtype, d.dtype)
        _tma_ab(A, major_a, m, k, "A")
        _tma_ab(B, major_b, n, k, "B")
        _tma(d, d.stride(-2), "D")
    else:
        fail(at(GEMM, 295), "Unsupported architecture or scaling factor types")
    a_deq = _operand(A, major_a) * tsfa.element_values(m, k)
    b_deq = _operand(B, major_b) * tsfb.element_values(n, k)
    _masked_write(d, a_deq, b_deq, masked_m)


# ---------------------------------------------------------------------------------------------------------------------
# K-grouped GEMMs
# ---------------------------------------------------------------------------------------------------------------------


def _k_groups(grouped_layout, ks_cpu, use_psum_layout, k_alignment, sum_k, api_panic_ks=True):
    """[(start, k_g)] as the kernel schedules them (scheduler/gemm.cuh get_next_k_group / get_next_psum_k_group)."""
    vals = grouped_layout.tolist()
    groups = []
    if use_psum_layout:
        prev_end = 0
        for g, end in enumerate(vals):
            start = align(prev_end, k_alignment)
            if end < start:
                panic(
                    f"psum grouped_layout[{g}] = {end} is smaller than the group's start {start} "
                    f"(= align(grouped_layout[{g - 1}], {k_alignment})): the scheduler computes an unsigned "
                    f"shape_k = {end} - {start} and reads far past A/B"
                )
            if end > sum_k:
                panic(
                    f"psum grouped_layout[{g}] = {end} exceeds A.size(0) = {sum_k}: the kernel reads K rows past "
                    f"the end of A/B"
                )
            groups.append((start, end - start))
            prev_end = end
        return groups
    if any(v < 0 for v in vals):
        panic(f"grouped_layout {vals} holds negative group sizes: the kernel reads them as huge unsigned K")
    if api_panic_ks and ks_cpu and list(ks_cpu) != vals:
        panic(
            f"grouped_layout (device K sizes {vals}) disagrees with ks_cpu {list(ks_cpu)}: the kernel schedules "
            f"from grouped_layout while the host sized the scale factors and descriptors from ks_cpu"
        )
    start = 0
    for v in vals:
        groups.append((start, v))
        start += v
    if start > sum_k:
        panic(f"the K sizes in grouped_layout sum to {start} > A.size(0) = {sum_k}: the kernel reads past A/B")
    return groups


def _k_grouped_packed_ue8m0(sf, grouped_layout, ks_cpu, gran_k, k_alignment, use_psum_layout):
    """``get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor`` (smxx_layout.hpp:255-316)."""
    check(gran_k in (32, 128), at(SMXX, 261), "gran_k == 32 or gran_k == 128")
    check(k_alignment % 32 == 0, at(SMXX, 262), "k_alignment % 32 == 0")
    sf_k, mn = _shape(sf, 2)
    num_groups = grouped_layout.numel()
    check(sf.is_contiguous(), at(SMXX, 266), "sf.is_contiguous()")
    check(num_groups <= 128 and mn % 4 == 0, at(SMXX, 267), "num_groups <= 128 and mn % 4 == 0")
    check(
        grouped_layout.is_contiguous() and grouped_layout.dtype == I32,
        at(SMXX, 268),
        "grouped_layout.is_contiguous() and grouped_layout.scalar_type() == torch::kInt",
    )
    has_synced_ks = bool(ks_cpu)
    if has_synced_ks:
        check(len(ks_cpu) == num_groups, at(SMXX, 272), "static_cast<int>(ks_cpu.value().size()) == num_groups")
    else:
        check(use_psum_layout, at(SMXX, 274), "use_psum_layout")
    if has_synced_ks:
        ref_sf_k = sum(ceil_div(kk, gran_k) for kk in ks_cpu)
        packed_sf_k = sum(ceil_div(kk, gran_k * 4) for kk in ks_cpu)
        check(use_psum_layout or ref_sf_k == sf_k, at(SMXX, 284), "use_psum_layout or ref_sf_k == sf_k")
    else:
        packed_sf_k = (sf_k + num_groups * 3) // 4
    out = torch.zeros((packed_sf_k, mn), dtype=I32)
    if packed_sf_k == 0:
        return out
    # The pack kernel walks grouped_layout (group K sizes, or psum ends): each group's ceil(k_g / gran_k) SF rows are
    # packed 4 per int32 row, the group's last pack zero-padded.
    vals = grouped_layout.tolist()
    prev_end, row, prow = 0, 0, 0
    for v in vals:
        k_g = v - align(prev_end, k_alignment) if use_psum_layout else v
        prev_end = v
        nrows = ceil_div(max(k_g, 0), gran_k)
        if nrows == 0:
            continue
        if row + nrows > sf_k:
            panic(
                f"the scale factors have {sf_k} rows but the groups of grouped_layout need at least {row + nrows}: "
                f"the pack kernel reads past the end of sf"
            )
        block = sf[row : row + nrows]
        codes, exact = _ref.fp32_codes(block)
        if not bool(exact.all()):
            r, col = (int(i) for i in (~exact).nonzero()[0])
            _ue8m0_panic_at(float(block[r, col]), [row + r, col], "pack_fp32_into_ue8m0")
        npack = ceil_div(nrows, 4)
        if prow + npack > packed_sf_k:
            panic(
                "ks_cpu undercounts the packed scale rows the groups of grouped_layout need: the pack kernel drops "
                "scales"
            )
        codes = torch.cat([codes, torch.zeros((npack * 4 - nrows, mn), dtype=codes.dtype)])
        out[prow : prow + npack] = _ref.pack_bytes(codes.reshape(npack, 4, mn).permute(0, 2, 1), 4).squeeze(-1).to(I32)
        row += nrows
        prow += npack
    return out


def _check_k_grouped_packed(sf, grouped_layout, ks_cpu, gran_k, k_alignment, use_psum_layout):
    """``check_k_grouped_packed_ue8m0_tensor`` (smxx_layout.hpp:319-351)."""
    check(gran_k in (32, 128), at(SMXX, 325), "gran_k == 32 or gran_k == 128")
    check(k_alignment % 32 == 0, at(SMXX, 326), "k_alignment % 32 == 0")
    check(sf.dtype == I32, at(SMXX, 327), "sf.scalar_type() == torch::kInt")
    check(sf.dim() == 2, at(SMXX, 328), "sf.dim() == 2")
    check(sf.is_contiguous(), at(SMXX, 329), "sf.is_contiguous()")
    packed_sf_k, mn = _shape(sf, 2)
    num_groups = grouped_layout.numel()
    check(mn % 4 == 0, at(SMXX, 333), "mn % 4 == 0")
    check(sf.stride(0) == mn and sf.stride(1) == 1, at(SMXX, 334), "sf.stride(0) == mn and sf.stride(1) == 1")
    check(
        grouped_layout.is_contiguous() and grouped_layout.dtype == I32,
        at(SMXX, 335),
        "grouped_layout.is_contiguous() and grouped_layout.scalar_type() == torch::kInt",
    )
    check(packed_sf_k > 0, at(SMXX, 336), "packed_sf_k > 0")
    if ks_cpu:
        check(len(ks_cpu) == num_groups, at(SMXX, 340), "static_cast<int>(ks_cpu.value().size()) == num_groups")
        if not use_psum_layout:
            aligned_packed_sf_k = sum(ceil_div(kk, gran_k * 4) for kk in ks_cpu)
            check(packed_sf_k >= aligned_packed_sf_k, at(SMXX, 345), "packed_sf_k >= aligned_packed_sf_k")
    else:
        check(use_psum_layout, at(SMXX, 348), "use_psum_layout")
    return sf


def _transform_k_grouped_sf(sf, ks_cpu, grouped_layout, recipe, k_alignment, use_psum_layout):
    """``layout::transform_k_grouped_sf_into_required_layout`` (csrc/apis/layout.hpp:92-120)."""
    check(sf.dim() == 2, at(LAYOUT_API, 98), "sf.dim() == 2")
    check(
        recipe[0] == 1 and recipe[1] == 1, at(LAYOUT_API, 99), "std::get<0>(recipe) == 1 and std::get<1>(recipe) == 1"
    )
    gran_k = recipe[2]
    check(gran_k in (32, 128), at(LAYOUT_API, 102), "gran_k == 32 or gran_k == 128")
    check(k_alignment % 32 == 0, at(LAYOUT_API, 103), "k_alignment % 32 == 0")
    arch = STATE.arch
    if sf.dtype == F32 and arch == 9:
        return _mn_major_tma_aligned(sf)
    if sf.dtype == F32 and arch == 10:
        return _k_grouped_packed_ue8m0(sf, grouped_layout, ks_cpu, gran_k, k_alignment, use_psum_layout)
    if sf.dtype == I32 and arch == 10:
        return _check_k_grouped_packed(sf, grouped_layout, ks_cpu, gran_k, k_alignment, use_psum_layout)
    fail(at(LAYOUT_API, 119), "Unknown cases")


def _k_grouped_scales_sm100(packed, groups, gran_k, mn, what):
    """Per-group element scales ``[k_g, mn]`` read from a compact per-group packed-UE8M0 tensor ``[P, mn]``."""
    if packed.size(1) != mn:
        panic(
            f"{what} has {packed.size(1)} columns but the operand has {mn}: the kernel's TMA descriptor uses "
            f"align({mn}, 4) as the scale row stride and would misread the scales"
        )
    codes = _ref.unpack_bytes(packed.T, 4)  # [mn, 4P]: column 4p + j = byte j of packed row p
    out, prow = [], 0
    for _, k_g in groups:
        if k_g <= 0:
            out.append(None)
            continue
        npack = ceil_div(k_g, gran_k * 4)
        if prow + npack > packed.size(0):
            panic(
                f"{what} has {packed.size(0)} packed rows but the groups need at least {prow + npack}: the kernel "
                f"reads past the scale factors"
            )
        idx = prow * 4 + torch.arange(k_g) // gran_k
        out.append(_ref.ue8m0_values(codes[:, idx]).T)
        prow += npack
    return out


def _k_grouped_common_checks(api, d, a_first, b_first, ks_cpu, grouped_layout, c, use_psum_layout, k_alignment, lines):
    num_groups, m, n = _shape(d, 3)
    sum_k_, m_ = _shape(a_first, 2)
    sum_k__, n_ = _shape(b_first, 2)
    sum_k = _check_k_grouped_args(
        ks_cpu, grouped_layout, num_groups, use_psum_layout, k_alignment, int(a_first.size(0))
    )
    check(
        m == m_ and n == n_ and sum_k == sum_k_ and sum_k == sum_k__,
        at(GEMM, lines[0]),
        "m == m_ and n == n_ and sum_k == sum_k_ and sum_k == sum_k__",
    )
    check(
        a_first.is_contiguous(), at(GEMM, lines[1]), "a.first.is_contiguous()" if "fp8" in api else "a.is_contiguous()"
    )
    check(
        b_first.is_contiguous(),
        at(GEMM, lines[1] + 1),
        "b.first.is_contiguous()" if "fp8" in api else "b.is_contiguous()",
    )
    check(d.is_contiguous(), at(GEMM, lines[1] + 2), "d.is_contiguous()")
    check(c is not None and c.is_contiguous(), at(GEMM, lines[1] + 3), "c.has_value() and c.value().is_contiguous()")
    return num_groups, m, n, sum_k


@public("k_grouped_fp8_gemm_tn_contiguous")
def k_grouped_fp8_gemm_tn_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 128), compiled_dims="mn", use_psum_layout=False
):
    """SM100: D[g] = C[g] + A_g^T @ B_g with A [sum_K, M], B [sum_K, N] (MN-major, groups along K), D [G, M, N]."""
    api = "k_grouped_fp8_gemm_tn_contiguous"
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    d = _tensor(d, api, "d")
    ks_cpu = _ks(ks_cpu, api)
    grouped_layout = _tensor(grouped_layout, api, "grouped_layout")
    c = _opt_tensor(c, api, "c")
    recipe = _ints(recipe, 3, api, "recipe", optional=False)

    check(recipe[0] == 1 and recipe[1] == 1, at(GEMM, 309), "std::get<0>(recipe) == 1 and std::get<1>(recipe) == 1")
    gran_k = recipe[2]
    check(gran_k in (32, 128), at(GEMM, 312), "gran_k == 32 or gran_k == 128")
    k_alignment = STATE.mk_alignment
    check(k_alignment % 32 == 0, at(GEMM, 314), "k_alignment % 32 == 0")
    num_groups, m, n, sum_k = _k_grouped_common_checks(
        api, d, A, B, ks_cpu, grouped_layout, c, use_psum_layout, k_alignment, (323, 325)
    )
    if _early_return(m, n, sum_k, d, c):
        return
    tsfa = _transform_k_grouped_sf(sfa, ks_cpu, grouped_layout, recipe, k_alignment, use_psum_layout)
    tsfb = _transform_k_grouped_sf(sfb, ks_cpu, grouped_layout, recipe, k_alignment, use_psum_layout)
    if STATE.arch != 10:
        fail(at(GEMM, 344), "Unsupported architecture")
    # sm100_k_grouped_fp8_gemm_1d1d (majors are passed as MN constants)
    check(gran_k in (32, 128), at(SM100_FP8, 325), "gran_k == 32 or gran_k == 128")
    check(k_alignment % 32 == 0, at(SM100_FP8, 326), "k_alignment % 32 == 0")
    _check_validity(A.dtype, B.dtype, d.dtype)
    _tma(A, A.stride(0), "A", m)
    _tma(B, B.stride(0), "B", n)
    _tma(d, d.stride(1), "D")
    if A.dtype == FP4 or B.dtype == FP4:
        panic(
            "packed FP4 operands reach the SM100 k-grouped kernel with their packed (halved) M/N taken as the "
            "logical size (no FP4 shape handling on this path): garbage"
        )
    groups = _k_groups(grouped_layout, ks_cpu, use_psum_layout, k_alignment, sum_k)
    sa = _k_grouped_scales_sm100(tsfa, groups, gran_k, m, "SFA")
    sb = _k_grouped_scales_sm100(tsfb, groups, gran_k, n, "SFB")
    for g, (start, k_g) in enumerate(groups):
        if k_g <= 0:
            continue
        a_g = A[start : start + k_g].to(F64) * sa[g]
        b_g = B[start : start + k_g].to(F64) * sb[g]
        _store(d[g], d[g].to(F64) + a_g.T @ b_g)


@public("k_grouped_fp8_gemm_nt_contiguous")
def k_grouped_fp8_gemm_nt_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, recipe=(1, 1, 128), compiled_dims="mn", use_psum_layout=False
):
    """SM90: flat K-major groups (group g of A is a row-major [M, k_g] block), FP32 D with ``c``."""
    api = "k_grouped_fp8_gemm_nt_contiguous"
    A, sfa = _pair(a, api, "a")
    B, sfb = _pair(b, api, "b")
    d = _tensor(d, api, "d")
    ks_cpu = _ks(ks_cpu, api)
    grouped_layout = _tensor(grouped_layout, api, "grouped_layout")
    c = _opt_tensor(c, api, "c")
    recipe = _ints(recipe, 3, api, "recipe", optional=False)

    check(recipe == (1, 1, 128), at(GEMM, 358), "recipe == std::make_tuple(1, 1, 128)")
    check(
        not use_psum_layout and ks_cpu is not None and len(ks_cpu) > 0,
        at(GEMM, 361),
        "not use_psum_layout and ks_cpu.has_value() and not ks_cpu.value().empty()",
    )
    num_groups, m, n = _shape(d, 3)
    sum_mk, sum_nk = A.numel(), B.numel()
    sum_k = _check_k_grouped_args(ks_cpu, grouped_layout, num_groups, use_psum_layout, 128)
    check(sum_mk == sum_k * m, at(GEMM, 369), "sum_mk == static_cast<int64_t>(sum_k) * m")
    check(sum_nk == sum_k * n, at(GEMM, 370), "sum_nk == static_cast<int64_t>(sum_k) * n")
    check(A.is_contiguous(), at(GEMM, 373), "a.first.is_contiguous()")
    check(B.is_contiguous(), at(GEMM, 374), "b.first.is_contiguous()")
    check(d.is_contiguous(), at(GEMM, 375), "d.is_contiguous()")
    check(c is not None and c.is_contiguous(), at(GEMM, 376), "c.has_value() and c.value().is_contiguous()")
    if _early_return(m, n, sum_k, d, c):
        return
    tsfa = _transform_k_grouped_sf(sfa, ks_cpu, grouped_layout, recipe, 128, False)
    tsfb = _transform_k_grouped_sf(sfb, ks_cpu, grouped_layout, recipe, 128, False)
    if STATE.arch != 9:
        fail(at(GEMM, 398), "Unsupported architecture")
    # sm90_k_grouped_fp8_gemm_1d1d
    check(c is not None and d.dtype == F32, at(SM90_1D1D, 155), "c.has_value() and d.scalar_type() == torch::kFloat")
    for kk in ks_cpu:
        check(kk % 128 == 0, at(SM90_1D1D, 166), "ks_cpu[i] % 128 == 0")
    _check_validity(A.dtype, B.dtype, d.dtype)
    first_k = next((kk for kk in ks_cpu if kk != 0), 0)
    _tma(A, first_k, "A")
    _tma(B, first_k, "B")
    _tma(d, d.stride(-2), "D")
    groups = _k_groups(grouped_layout, ks_cpu, False, 128, sum_k)
    sum_sf_k = sum(ceil_div(kk, 128) for kk in ks_cpu)
    for t, mn, what in ((tsfa, m, "SFA"), (tsfb, n, "SFB")):
        if t.size(0) != mn or t.size(1) < sum_sf_k:
            panic(
                f"{what} has shape {tuple(t.shape)} but the SM90 k-grouped kernel reads it as [{mn}, "
                f">= {sum_sf_k}] (MN-major, one column per 128 K): the scales would be misread"
            )
    a_flat, b_flat = A.reshape(-1), B.reshape(-1)
    for g, (start, k_g) in enumerate(groups):
        if k_g == 0:
            continue
        cols = start // 128 + torch.arange(k_g) // 128
        a_g = a_flat[m * start : m * (start + k_g)].view(m, k_g).to(F64) * tsfa[:, cols].to(F64)
        b_g = b_flat[n * start : n * (start + k_g)].view(n, k_g).to(F64) * tsfb[:, cols].to(F64)
        _store(d[g], d[g].to(F64) + _ref.mm_nt(a_g, b_g))


# ---------------------------------------------------------------------------------------------------------------------
# BF16 GEMMs
# ---------------------------------------------------------------------------------------------------------------------


def _bf16_gemm_nt(api, a, b, d, c, compiled_dims):
    a = _tensor(a, api, "a")
    b = _tensor(b, api, "b")
    d = _tensor(d, api, "d")
    c = _opt_tensor(c, api, "c")
    major_a, major_b = _major_ab(a), _major_ab(b)
    _check_cd(d)
    m, k = _shape(a, 2)
    n, k_ = _shape(b, 2)
    m_, n_ = _shape(d, 2)
    check(m == m_ and n == n_ and k == k_, at(GEMM, 420), "m == m_ and n == n_ and k == k_")
    check(a.dtype == BF16, at(GEMM, 421), "a.scalar_type() == torch::kBFloat16")
    check(b.dtype == BF16, at(GEMM, 422), "b.scalar_type() == torch::kBFloat16")
    check(
        d.dtype in (BF16, F32), at(GEMM, 423), "d.scalar_type() == torch::kBFloat16 or d.scalar_type() == torch::kFloat"
    )
    if _early_return(m, n, k, d, c):
        return
    _check_validity(a.dtype, b.dtype, d.dtype)
    _tma_ab(a, major_a, m, k, "A")
    _tma_ab(b, major_b, n, k, "B")
    _tma(d, d.stride(-2), "D")
    acc = d.to(F64) if c is not None else 0.0
    _store(d, acc + _ref.mm_nt(a, b))


@public("bf16_gemm_nt")
def bf16_gemm_nt(a, b, d, c=None, compiled_dims="nk"):
    """D = C + A @ B^T, A [M, K], B [N, K] BF16 (any majors), D BF16 or FP32."""
    _bf16_gemm_nt("bf16_gemm_nt", a, b, d, c, compiled_dims)


@public("bf16_gemm_nn")
def bf16_gemm_nn(a, b, d, c=None, compiled_dims="nk"):
    _bf16_gemm_nt("bf16_gemm_nn", a, _t01(_tensor(b, "bf16_gemm_nn", "b")), d, c, compiled_dims)


@public("bf16_gemm_tn")
def bf16_gemm_tn(a, b, d, c=None, compiled_dims="mn"):
    _bf16_gemm_nt(
        "bf16_gemm_tn",
        _t01(_tensor(a, "bf16_gemm_tn", "a")),
        _t01(_tensor(b, "bf16_gemm_tn", "b")),
        d,
        c,
        compiled_dims,
    )


@public("bf16_gemm_tt")
def bf16_gemm_tt(a, b, d, c=None, compiled_dims="mn"):
    _bf16_gemm_nt("bf16_gemm_tt", _t01(_tensor(a, "bf16_gemm_tt", "a")), b, d, c, compiled_dims)


def _m_grouped_bf16_nt(
    api, a, b, d, grouped_layout, compiled_dims, use_psum_layout, ensure_zero_padding, expected_m_for_psum_layout
):
    a = _tensor(a, api, "a")
    b = _tensor(b, api, "b")
    d = _tensor(d, api, "d")
    grouped_layout = _tensor(grouped_layout, api, "grouped_layout")
    major_a, major_b = _major_ab(a), _major_ab(b)
    check(major_a == K_MAJOR, at(GEMM, 473), "major_a == cute::UMMA::Major::K")
    check(grouped_layout.is_contiguous(), at(GEMM, 474), "grouped_layout.is_contiguous()")
    m, k = _shape(a, 2)
    num_groups, n, k_ = _shape(b, 3)
    m_, n_ = _shape(d, 2)
    check(m == m_ and n == n_ and k == k_, at(GEMM, 480), "m == m_ and n == n_ and k == k_")
    check(n > 0 and k > 0 and num_groups > 0, at(GEMM, 481), "n > 0 and k > 0 and num_groups > 0")
    check(a.dtype == BF16, at(GEMM, 482), "a.scalar_type() == torch::kBFloat16")
    check(b.dtype == BF16, at(GEMM, 483), "b.scalar_type() == torch::kBFloat16")
    check(d.dtype == BF16, at(GEMM, 484), "d.scalar_type() == torch::kBFloat16")
    check(grouped_layout.dtype == I32, at(GEMM, 485), "grouped_layout.scalar_type() == torch::kInt")
    if use_psum_layout:
        (num_groups_,) = _shape(grouped_layout, 1)
        check(num_groups == num_groups_, at(GEMM, 490), "num_groups == num_groups_")
    else:
        (m__,) = _shape(grouped_layout, 1)
        check(m == m__, at(GEMM, 493), "m == m__")
        check(expected_m_for_psum_layout is None, at(GEMM, 494), "not expected_m_for_psum_layout.has_value()")
    _check_cd(d)
    if m == 0:
        return
    if STATE.arch == 9:
        check(d.dtype == BF16, at(SM90_BF16, 141), "d.scalar_type() == torch::kBFloat16")
        check(major_a == K_MAJOR, at(SM90_BF16, 142), "major_a == cute::UMMA::Major::K")
        check(k % 64 == 0, at(SM90_BF16, 143), "k % 64 == 0")
        if expected_m_for_psum_layout is not None:
            check(use_psum_layout, at(SM90_BF16, 150), "use_psum_layout")
        zero_gaps = False
    else:
        if expected_m_for_psum_layout is not None:
            check(use_psum_layout, at(SM100_BF16, 148), "use_psum_layout")
        zero_gaps = bool(ensure_zero_padding)
    _check_validity(a.dtype, b.dtype, d.dtype)
    _tma_ab(a, major_a, m, k, "A")
    _tma_ab(b, major_b, n, k, "B")
    _tma(d, d.stride(-2), "D")
    _m_grouped_write(d, a.to(F64), b.to(F64), grouped_layout, use_psum_layout, zero_gaps)


@public("m_grouped_bf16_gemm_nt_contiguous")
def m_grouped_bf16_gemm_nt_contiguous(
    a,
    b,
    d,
    grouped_layout,
    compiled_dims="nk",
    use_psum_layout=False,
    ensure_zero_padding=True,
    expected_m_for_psum_layout=None,
):
    _m_grouped_bf16_nt(
        "m_grouped_bf16_gemm_nt_contiguous",
        a,
        b,
        d,
        grouped_layout,
        compiled_dims,
        use_psum_layout,
        ensure_zero_padding,
        expected_m_for_psum_layout,
    )


@public("m_grouped_bf16_gemm_nn_contiguous")
def m_grouped_bf16_gemm_nn_contiguous(
    a, b, d, grouped_layout, compiled_dims="nk", use_psum_layout=False, ensure_zero_padding=True
):
    api = "m_grouped_bf16_gemm_nn_contiguous"
    _m_grouped_bf16_nt(
        api,
        a,
        _tensor(b, api, "b").transpose(1, 2),
        d,
        grouped_layout,
        compiled_dims,
        use_psum_layout,
        ensure_zero_padding,
        None,
    )


@public("m_grouped_bf16_gemm_nt_masked")
def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, compiled_dims="nk"):
    api = "m_grouped_bf16_gemm_nt_masked"
    a = _tensor(a, api, "a")
    b = _tensor(b, api, "b")
    d = _tensor(d, api, "d")
    masked_m = _tensor(masked_m, api, "masked_m")
    expected_m = int(expected_m)
    major_a, major_b = _major_ab(a), _major_ab(b)
    check(
        major_a == K_MAJOR and major_b == K_MAJOR,
        at(GEMM, 534),
        "major_a == cute::UMMA::Major::K and major_b == cute::UMMA::Major::K",
    )
    check(masked_m.is_contiguous(), at(GEMM, 535), "masked_m.is_contiguous()")
    num_groups, m, k = _shape(a, 3)
    num_groups_, n, k_ = _shape(b, 3)
    num_groups__, m_, n_ = _shape(d, 3)
    num_groups___ = masked_m.numel()
    check(
        num_groups == num_groups_ and num_groups == num_groups__ and num_groups == num_groups___,
        at(GEMM, 542),
        "num_groups == num_groups_ and num_groups == num_groups__ and num_groups == num_groups___",
    )
    check(m == m_ and n == n_ and k == k_, at(GEMM, 543), "m == m_ and n == n_ and k == k_")
    check(
        expected_m > 0 and m > 0 and n > 0 and k > 0 and num_groups > 0,
        at(GEMM, 544),
        "expected_m > 0 and m > 0 and n > 0 and k > 0 and num_groups > 0",
    )
    check(a.dtype == BF16, at(GEMM, 545), "a.scalar_type() == torch::kBFloat16")
    check(b.dtype == BF16, at(GEMM, 546), "b.scalar_type() == torch::kBFloat16")
    check(d.dtype == BF16, at(GEMM, 547), "d.scalar_type() == torch::kBFloat16")
    check(masked_m.dtype == I32, at(GEMM, 548), "masked_m.scalar_type() == torch::kInt")
    _check_cd(d)
    if STATE.arch == 9:
        check(d.dtype == BF16, at(SM90_BF16, 210), "d.scalar_type() == torch::kBFloat16")
        check(
            major_a == K_MAJOR and major_b == K_MAJOR,
            at(SM90_BF16, 211),
            "major_a == cute::UMMA::Major::K and major_b == cute::UMMA::Major::K",
        )
        check(k % 64 == 0, at(SM90_BF16, 212), "k % 64 == 0")
    _check_validity(a.dtype, b.dtype, d.dtype)
    _tma_ab(a, major_a, m, k, "A")
    _tma_ab(b, major_b, n, k, "B")
    _tma(d, d.stride(-2), "D")
    _masked_write(d, a.to(F64), b.to(F64), masked_m)


@public("k_grouped_bf16_gemm_tn_contiguous")
def k_grouped_bf16_gemm_tn_contiguous(
    a, b, d, ks_cpu, grouped_layout, c=None, compiled_dims="mn", use_psum_layout=False
):
    """D[g] = C[g] + A_g^T @ B_g, A [sum_K, M], B [sum_K, N] BF16 contiguous, D [G, M, N]."""
    api = "k_grouped_bf16_gemm_tn_contiguous"
    a = _tensor(a, api, "a")
    b = _tensor(b, api, "b")
    d = _tensor(d, api, "d")
    ks_cpu = _ks(ks_cpu, api)
    grouped_layout = _tensor(grouped_layout, api, "grouped_layout")
    c = _opt_tensor(c, api, "c")
    num_groups, m, n = _shape(d, 3)
    _shape(a, 2)
    _shape(b, 2)
    k_alignment = STATE.mk_alignment
    check(k_alignment % 32 == 0, at(GEMM, 580), "k_alignment % 32 == 0")
    num_groups, m, n, sum_k = _k_grouped_common_checks(
        api, d, a, b, ks_cpu, grouped_layout, c, use_psum_layout, k_alignment, (583, 586)
    )
    if _early_return(m, n, sum_k, d, c):
        return
    if STATE.arch == 9:
        check(
            not use_psum_layout and ks_cpu is not None and len(ks_cpu) > 0,
            at(GEMM, 599),
            "not use_psum_layout and ks_cpu.has_value() and not ks_cpu.value().empty()",
        )
        for kk in ks_cpu:
            check(kk % 128 == 0, at(SM90_BF16, 275), "k % 128 == 0")
    _check_validity(a.dtype, b.dtype, d.dtype)
    _tma(a, a.stride(0), "A")
    _tma(b, b.stride(0), "B")
    _tma(d, d.stride(1), "D")
    groups = _k_groups(grouped_layout, ks_cpu, use_psum_layout, k_alignment, sum_k)
    for g, (start, k_g) in enumerate(groups):
        if k_g <= 0:
            continue
        _store(d[g], d[g].to(F64) + a[start : start + k_g].to(F64).T @ b[start : start + k_g].to(F64))


# ---------------------------------------------------------------------------------------------------------------------
# Layout utilities and runtime
# ---------------------------------------------------------------------------------------------------------------------


@public("transform_sf_into_required_layout")
def transform_sf_into_required_layout(
    sf, mn, k, recipe, num_groups=None, is_sfa=None, disable_ue8m0_cast=False, psum_layout=None
):
    """csrc/apis/layout.hpp:14-61: FP32 (1,128)/(128,128) on SM90 (or with disable_ue8m0_cast) -> FP32 (MN-major,
    TMA-aligned / unchanged); FP32 on SM100 -> packed UE8M0 int32 MN-major; int32 on SM100 -> validated as is."""
    api = "transform_sf_into_required_layout"
    sf = _tensor(sf, api, "sf")
    recipe = _ints(recipe, (2, 3), api, "recipe", optional=False)
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
    )[0]


@public("get_tma_aligned_size")
def get_tma_aligned_size(x, element_size):
    return _tma_aligned_size(int(x), int(element_size))


@public("get_mn_major_tma_aligned_tensor")
def get_mn_major_tma_aligned_tensor(sf):
    return _mn_major_tma_aligned(_tensor(sf, "get_mn_major_tma_aligned_tensor", "sf"))


@public("get_mn_major_tma_aligned_packed_ue8m0_tensor")
def get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum_layout=None):
    api = "get_mn_major_tma_aligned_packed_ue8m0_tensor"
    return _packed_ue8m0(_tensor(sf, api, "sf"), _opt_tensor(psum_layout, api, "psum_layout"))


@public("get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor")
def get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
    sf, grouped_layout, ks_cpu, gran_k, k_alignment, use_psum_layout=False
):
    api = "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor"
    ks = _ks(ks_cpu, api)
    grouped_layout = _tensor(grouped_layout, api, "grouped_layout")
    if not use_psum_layout and ks and list(ks) != grouped_layout.tolist():
        panic(
            f"grouped_layout {grouped_layout.tolist()} disagrees with ks_cpu {ks}: the pack kernel walks "
            f"grouped_layout while the output was sized from ks_cpu"
        )
    return _k_grouped_packed_ue8m0(
        _tensor(sf, api, "sf"), grouped_layout, ks, int(gran_k), int(k_alignment), bool(use_psum_layout)
    )


@public("set_mk_alignment_for_contiguous_layout")
def set_mk_alignment_for_contiguous_layout(new_value):
    STATE.mk_alignment = int(new_value)


@public("get_mk_alignment_for_contiguous_layout")
def get_mk_alignment_for_contiguous_layout():
    return STATE.mk_alignment


@public("get_theoretical_mk_alignment_for_contiguous_layout")
def get_theoretical_mk_alignment_for_contiguous_layout(expected_m=None):
    """csrc/jit_kernels/heuristics/runtime.hpp:47-57."""
    if STATE.arch != 10:
        return 128
    block_m, mma_step = 224, 32
    if expected_m is not None:
        while block_m > 32 and block_m - mma_step >= int(expected_m):
            block_m -= mma_step
    return block_m


@public("set_num_sms")
def set_num_sms(new_num_sms):
    new_num_sms = int(new_num_sms)
    check(
        0 <= new_num_sms <= DEVICE_SMS[STATE.arch],
        at(DEVICE_RUNTIME, 104),
        "0 <= new_num_sms and new_num_sms <= get_prop()->multiProcessorCount",
    )
    STATE.num_sms = new_num_sms


@public("get_num_sms")
def get_num_sms():
    return _num_sms()


@public("set_tc_util")
def set_tc_util(new_tc_util):
    new_tc_util = int(new_tc_util)
    check(0 <= new_tc_util <= 100, at(DEVICE_RUNTIME, 119), "0 <= new_tc_util and new_tc_util <= 100")
    STATE.tc_util = new_tc_util


@public("get_tc_util")
def get_tc_util():
    return 100 if STATE.tc_util == 0 else STATE.tc_util


@public("set_pdl")
def set_pdl(new_enable_pdl):
    STATE.pdl = bool(new_enable_pdl)


@public("get_pdl")
def get_pdl():
    return STATE.pdl


@public("set_ignore_compile_dims")
def set_ignore_compile_dims(new_value):
    STATE.ignore_compile_dims = bool(new_value)


@public("set_block_size_multiple_of")
def set_block_size_multiple_of(new_value):
    if isinstance(new_value, (tuple, list)):
        x, y = _ints(new_value, 2, "set_block_size_multiple_of", "new_value", optional=False)
    else:
        x = y = int(new_value)
    STATE.block_size_multiple_of = (x, y)


def _exports():
    ex = {
        "fp8_fp4_gemm_nt": fp8_fp4_gemm_nt,
        "fp8_fp4_gemm_nn": fp8_fp4_gemm_nn,
        "fp8_fp4_gemm_tn": fp8_fp4_gemm_tn,
        "fp8_fp4_gemm_tt": fp8_fp4_gemm_tt,
        "m_grouped_fp8_fp4_gemm_nt_contiguous": m_grouped_fp8_fp4_gemm_nt_contiguous,
        "m_grouped_fp8_fp4_gemm_nn_contiguous": m_grouped_fp8_fp4_gemm_nn_contiguous,
        "m_grouped_fp8_fp4_gemm_nt_masked": m_grouped_fp8_fp4_gemm_nt_masked,
        "k_grouped_fp8_gemm_tn_contiguous": k_grouped_fp8_gemm_tn_contiguous,
        "k_grouped_fp8_gemm_nt_contiguous": k_grouped_fp8_gemm_nt_contiguous,
        "bf16_gemm_nt": bf16_gemm_nt,
        "bf16_gemm_nn": bf16_gemm_nn,
        "bf16_gemm_tn": bf16_gemm_tn,
        "bf16_gemm_tt": bf16_gemm_tt,
        "m_grouped_bf16_gemm_nt_contiguous": m_grouped_bf16_gemm_nt_contiguous,
        "m_grouped_bf16_gemm_nn_contiguous": m_grouped_bf16_gemm_nn_contiguous,
        "m_grouped_bf16_gemm_nt_masked": m_grouped_bf16_gemm_nt_masked,
        "k_grouped_bf16_gemm_tn_contiguous": k_grouped_bf16_gemm_tn_contiguous,
        "transform_sf_into_required_layout": transform_sf_into_required_layout,
        "get_tma_aligned_size": get_tma_aligned_size,
        "get_mn_major_tma_aligned_tensor": get_mn_major_tma_aligned_tensor,
        "get_mn_major_tma_aligned_packed_ue8m0_tensor": get_mn_major_tma_aligned_packed_ue8m0_tensor,
        "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor": (
            get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor
        ),
        "set_mk_alignment_for_contiguous_layout": set_mk_alignment_for_contiguous_layout,
        "get_mk_alignment_for_contiguous_layout": get_mk_alignment_for_contiguous_layout,
        "get_theoretical_mk_alignment_for_contiguous_layout": get_theoretical_mk_alignment_for_contiguous_layout,
        "set_num_sms": set_num_sms,
        "get_num_sms": get_num_sms,
        "set_tc_util": set_tc_util,
        "get_tc_util": get_tc_util,
        "set_pdl": set_pdl,
        "get_pdl": get_pdl,
        "set_ignore_compile_dims": set_ignore_compile_dims,
        "set_block_size_multiple_of": set_block_size_multiple_of,
    }
    # csrc/apis/gemm.hpp:711-717 (m.attr aliases: the same function objects)
    for suffix in ("nt", "nn", "tn", "tt"):
        ex[f"fp8_gemm_{suffix}"] = ex[f"fp8_fp4_gemm_{suffix}"]
    ex["m_grouped_fp8_gemm_nt_contiguous"] = ex["m_grouped_fp8_fp4_gemm_nt_contiguous"]
    ex["m_grouped_fp8_gemm_nn_contiguous"] = ex["m_grouped_fp8_fp4_gemm_nn_contiguous"]
    ex["m_grouped_fp8_gemm_nt_masked"] = ex["m_grouped_fp8_fp4_gemm_nt_masked"]
    # deep_gemm/__init__.py legacy aliases
    ex["fp8_m_grouped_gemm_nt_masked"] = ex["m_grouped_fp8_gemm_nt_masked"]
    ex["bf16_m_grouped_gemm_nt_masked"] = ex["m_grouped_bf16_gemm_nt_masked"]
    # deep_gemm/utils/layout.py aliases (star-exported at top level)
    ex["get_m_alignment_for_contiguous_layout"] = ex["get_mk_alignment_for_contiguous_layout"]
    ex["get_k_alignment_for_contiguous_layout"] = ex["get_mk_alignment_for_contiguous_layout"]
    # Exported by upstream, not modelled here (einsum, MQA logits and HC prenorm: _cuda_extra.EXPORTS; Mega MoE:
    # _cuda_mega.EXPORTS)
    stubs = {
        "cublaslt_gemm_nt": "a, b, d, c=None",
        "cublaslt_gemm_nn": "a, b, d, c=None",
        "cublaslt_gemm_tn": "a, b, d, c=None",
        "cublaslt_gemm_tt": "a, b, d, c=None",
        "fp8_gemm_nt_skip_head_mid": "a, b, d, head_splits, recipe=None, compiled_dims='nk', disable_ue8m0_cast=False",
    }
    for name, params in stubs.items():
        ex[name] = not_implemented(name, params)
    return ex


EXPORTS = _exports()
