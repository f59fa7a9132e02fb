"""The grouped family on DeepGEMM (deepgemm_api.md §4-§5, §16.2; DeepGEMM 2.6.1 ``csrc/apis/gemm.hpp``):

* ``m_grouped_fp8_gemm`` / ``m_grouped_bf16_gemm``, psum layouts whose ``alignment`` is the library's
  ``get_mk_alignment_for_contiguous_layout()`` (its kernels' BLOCK_M, a global setting: a call with another alignment
  means other group starts, so it stays on the next kernel), on ``m_grouped_*_gemm_nt_contiguous(...,
  use_psum_layout=True)``. Group-id layouts are refused: the kernels take a whole BLOCK_M tile's group from its first
  row, and whether our ids keep each tile to one group is a host read. CUDA gives BF16 only; Ascend BF16 or FP32.
* ``m_grouped_fp8_gemm_masked`` / ``m_grouped_bf16_gemm_masked`` on ``m_grouped_*_gemm_nt_masked`` (CUDA only: the
  Ascend build has no masked GEMMs), ``expected_m`` the batch's row capacity (a scheduling hint).
* ``k_grouped_fp8_gemm`` / ``k_grouped_bf16_gemm`` (the experts' weight gradients) on SM100's
  ``k_grouped_*_gemm_tn_contiguous(..., ks_cpu=None, use_psum_layout=True)``: our ``[S, M]`` / ``[S, N]`` operands are
  its "tn" form and our scale rows (``ceil(k_g / gran_k)`` per group, one after another) its per-group layout;
  ``c`` (or zeros) is its mandatory accumulator, passed as ``d``. Not SM90 (its kernels need the groups' sizes on the
  host). DeepGEMM-Ascend takes the same forms (alignment 256) with its scales laid out per absolute 32-row block of
  K (``[ceil(S / 32), M]``): our per-group rows are remapped on the device (any ``gran_k`` a multiple of 32: each
  block takes its ``gran_k`` block's scale, exactly), not while a graph is captured.

Scales and recipes as ``fp8_gemm``'s (SM90: FP8, K-major, 1x128 x 128x128 with FP32 scales; SM100 and Ascend: UE8M0
scales). Rows our op defines as zero (psum gaps and the rows after the last group; masked rows at or past
``masked_m[g]``) are zeroed on the device after the call: the kernels leave them or store whole tiles there. Our
layout value errors come first (a host read, skipped while capturing, when the layout is clamped on the device instead:
ends non-decreasing and within the rows, ``masked_m`` within the batch, so no kernel reads past its tensors).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.portable import grouped as portable
from torch_ascend_moe.backends.upstream.deep_gemm import (
    ASCEND,
    CUDA,
    SM90,
    as_library_fp4,
    cuda_arch,
    cuda_refusal,
    real_refusal,
    scale_refusal,
    scales_as_fp32,
    tma_refusal,
)
from torch_ascend_moe.checks.fp8_gemm import logical_k
from torch_ascend_moe.checks.grouped import (
    K_GROUPED,
    M_GROUPED,
    M_GROUPED_FP8,
    MASKED,
    MASKED_FP8,
    k_fp8_segments,
    k_grouped_fp8_signature,
    k_grouped_signature,
    layout_segments,
    m_grouped_fp8_signature,
    m_grouped_signature,
    masked_fp8_signature,
    masked_rows,
    masked_signature,
)
from torch_ascend_moe.distributed.capture import host_readable

_FP8 = torch.float8_e4m3fn


def _alignment_refusal(library, psum: bool, alignment: int) -> str | None:
    if not psum:
        return "a group-id layout (the kernels take a tile's group from its first row: a host read to check)"
    ours = library.module().get_mk_alignment_for_contiguous_layout()
    return None if alignment == ours else f"alignment {alignment} (the library's layouts are aligned to {ours})"


def _shape_refusal(rows: int, n: int, k: int, groups: int, dtype: torch.dtype, cuda: bool) -> str | None:
    if not (rows and n and k and groups):
        return "empty operands: nothing to hand the library"
    if cuda and dtype != torch.bfloat16:
        return f"{dtype} output (the CUDA build's grouped GEMMs give BF16)"
    if dtype not in (torch.bfloat16, torch.float32):
        return f"{dtype} output (BF16 or FP32)"
    return "N not a multiple of 16 bytes of output (TMA)" if (n * dtype.itemsize) % 16 else None


def _fp8_refusal(a, sfa, b, sfb, recipe_a, recipe_b, cuda: bool) -> str | None:
    """The FP8/FP4 operand and scale rules of the grouped kernels (see ``fp8_gemm``'s module)."""
    why = real_refusal(a, sfa, b, sfb) or tma_refusal(a=a, b=b)
    if why:
        return why
    if a.stride(-1) != 1:
        return "an MN-major A (the grouped kernels take K-major A)"
    ra, rb = list(recipe_a), list(recipe_b)
    if cuda and cuda_arch() == SM90:
        if a.dtype != _FP8 or b.dtype != _FP8:
            return "packed FP4 on SM90 (FP4 kernels are SM100's)"
        if b.stride(-1) != 1:
            return "an MN-major B (SM90's FP8 kernels take K-major B)"
        if ra != [1, 128] or rb != [128, 128]:
            return f"recipes {ra} x {rb}: SM90's grouped GEMMs are 1x128 x 128x128"
        return None if b.shape[1] % 8 == 0 else "N not a multiple of 8 (the SM90 1D2D kernel's device assert)"
    why = scale_refusal(sfa, sfb, library_keeps_fp32=False)
    if why:
        return why
    if cuda:
        if ra[1] not in (32, 128) or rb[1] not in (32, 128):
            return f"gran_k {ra[1]} / {rb[1]}: SM100 takes 32 or 128"
        fp4_k = (a.dtype == torch.uint8 or b.dtype == torch.uint8) and logical_k(a) % 128
        return "packed FP4 with K not a multiple of 128 (its TMA rule)" if fp4_k else None
    if ra[1] != 32 or rb[1] != 32:
        return f"gran_k {ra[1]} / {rb[1]}: DeepGEMM-Ascend takes 32 only"
    if any(g < 1 or g > 128 or g & (g - 1) for g in (ra[0], rb[0])):
        return f"gran_mn {ra[0]} / {rb[0]}: DeepGEMM-Ascend takes a power of two up to 128"
    return None


def _bf16_refusal(a, b, cuda: bool) -> str | None:
    if a.dtype != torch.bfloat16:
        return f"{a.dtype} operands (the library's grouped GEMMs are BF16 or FP8)"
    why = real_refusal(a, b) or tma_refusal(a=a, b=b)
    if why:
        return why
    if a.stride(-1) != 1:
        return "an MN-major A (the grouped kernels take K-major A)"
    if cuda and cuda_arch() == SM90 and a.shape[-1] % 64:
        return "K not a multiple of 64 (SM90's BF16 grouped kernel)"
    return None


def _psum_layout(layout: torch.Tensor, rows: int) -> torch.Tensor:
    """The library's ``grouped_layout``: int32 cumulative ends, clamped into ``[0, rows]`` and non-decreasing (the
    identity on a layout our checks accept; what an unvalidated one becomes while capturing)."""
    ends = layout.long().clamp(0, rows)
    return torch.cummax(ends, 0).values.int().contiguous()


def _owned(layout: torch.Tensor, alignment: int, rows: int) -> torch.Tensor:
    return portable.covering_psum_groups(layout, alignment, rows)[1].unsqueeze(1)


def _takes_m_grouped_fp8(library, cuda: bool, args) -> str | None:
    a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype = args
    _, dtype = m_grouped_fp8_signature(*args)
    why = _shape_refusal(a.shape[0], b.shape[1], logical_k(a), b.shape[0], dtype, cuda)
    why = why or (cuda_refusal() if cuda else None) or _alignment_refusal(library, psum, alignment)
    return why or _fp8_refusal(a, sfa, b, sfb, recipe_a, recipe_b, cuda)


def _m_grouped_fp8(library, cuda: bool, a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    shape, dtype = m_grouped_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)
    rows = a.shape[0]
    if host_readable(layout):
        layout_segments(M_GROUPED_FP8, layout, psum, alignment, rows, b.shape[0])  # our op's value errors
    ends = _psum_layout(layout, rows)
    d = torch.empty(shape, dtype=dtype, device=a.device)
    extra = {"disable_ue8m0_cast": cuda_arch() == SM90} if cuda else {}
    library.module().m_grouped_fp8_fp4_gemm_nt_contiguous(
        (as_library_fp4(a), scales_as_fp32(sfa)),
        (as_library_fp4(b), scales_as_fp32(sfb)),
        d,
        ends,
        recipe_a=tuple(recipe_a),
        recipe_b=tuple(recipe_b),
        use_psum_layout=True,
        ensure_zero_padding=True,
        **extra,
    )
    return torch.where(_owned(ends, alignment, rows), d, 0)


def _takes_m_grouped_fp8_cuda(*call):
    return first_refusal(_takes_m_grouped_fp8(CUDA, True, call))


def _takes_m_grouped_fp8_ascend(*call):
    return first_refusal(_takes_m_grouped_fp8(ASCEND, False, call))


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous (psum)",
    takes=_takes_m_grouped_fp8_cuda,
    available=CUDA.available,
)
def m_grouped_fp8_gemm(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    return _m_grouped_fp8(CUDA, True, a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)


@kernel(
    "m_grouped_fp8_gemm",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous (Ascend, psum)",
    takes=_takes_m_grouped_fp8_ascend,
    available=ASCEND.available,
)
def m_grouped_fp8_gemm_ascend(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    return _m_grouped_fp8(ASCEND, False, a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)


def _takes_m_grouped_bf16(library, cuda: bool, args) -> str | None:
    a, b, layout, psum, alignment, out_dtype = args
    _, dtype = m_grouped_signature(*args)
    why = _shape_refusal(a.shape[0], b.shape[1], a.shape[1], b.shape[0], dtype, cuda)
    why = why or (cuda_refusal() if cuda else None) or _alignment_refusal(library, psum, alignment)
    return why or _bf16_refusal(a, b, cuda)


def _m_grouped_bf16(library, a, b, layout, psum, alignment, out_dtype):
    shape, dtype = m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
    rows = a.shape[0]
    if host_readable(layout):
        layout_segments(M_GROUPED, layout, psum, alignment, rows, b.shape[0])  # our op's value errors
    ends = _psum_layout(layout, rows)
    d = torch.empty(shape, dtype=dtype, device=a.device)
    library.module().m_grouped_bf16_gemm_nt_contiguous(a, b, d, ends, use_psum_layout=True, ensure_zero_padding=True)
    return torch.where(_owned(ends, alignment, rows), d, 0)


def _takes_m_grouped_bf16_cuda(*call):
    return first_refusal(_takes_m_grouped_bf16(CUDA, True, call))


def _takes_m_grouped_bf16_ascend(*call):
    return first_refusal(_takes_m_grouped_bf16(ASCEND, False, call))


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.m_grouped_bf16_gemm_nt_contiguous (psum)",
    takes=_takes_m_grouped_bf16_cuda,
    available=CUDA.available,
)
def m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype):
    return _m_grouped_bf16(CUDA, a, b, layout, psum, alignment, out_dtype)


@kernel(
    "m_grouped_bf16_gemm",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.m_grouped_bf16_gemm_nt_contiguous (Ascend, psum)",
    takes=_takes_m_grouped_bf16_ascend,
    available=ASCEND.available,
)
def m_grouped_bf16_gemm_ascend(a, b, layout, psum, alignment, out_dtype):
    return _m_grouped_bf16(ASCEND, a, b, layout, psum, alignment, out_dtype)


def _masked_rows(masked_m: torch.Tensor, m_max: int) -> torch.Tensor:
    """``masked_m`` as the library takes it: int32, contiguous, within ``[0, m_max]`` (the identity on values our
    checks accept)."""
    return masked_m.clamp(0, m_max).int().contiguous()


def _masked_result(d: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
    valid = torch.arange(d.shape[1], device=d.device).unsqueeze(0) < masked_m.unsqueeze(1)
    return torch.where(valid.unsqueeze(2), d, 0)


def _takes_masked_fp8(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
    _, dtype = masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
    groups, m_max = a.shape[0], a.shape[1]
    why = _shape_refusal(groups * m_max, b.shape[1], logical_k(a), groups, dtype, True) or cuda_refusal()
    return first_refusal(why or _fp8_refusal(a, sfa, b, sfb, recipe_a, recipe_b, True))


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked",
    takes=_takes_masked_fp8,
    available=CUDA.available,
)
def m_grouped_fp8_gemm_masked(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
    shape, dtype = masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
    m_max = a.shape[1]
    if host_readable(masked_m):
        masked_rows(MASKED_FP8, masked_m, m_max)  # our op's value errors
    counts = _masked_rows(masked_m, m_max)
    d = torch.empty(shape, dtype=dtype, device=a.device)
    CUDA.module().m_grouped_fp8_fp4_gemm_nt_masked(
        (as_library_fp4(a), scales_as_fp32(sfa)),
        (as_library_fp4(b), scales_as_fp32(sfb)),
        d,
        counts,
        m_max,
        recipe_a=tuple(recipe_a),
        recipe_b=tuple(recipe_b),
        disable_ue8m0_cast=cuda_arch() == SM90,
    )
    return _masked_result(d, counts)


def _takes_masked_bf16(a, b, masked_m, out_dtype):
    _, dtype = masked_signature(a, b, masked_m, out_dtype)
    groups, m_max = a.shape[0], a.shape[1]
    why = _shape_refusal(groups * m_max, b.shape[1], a.shape[2], groups, dtype, True) or cuda_refusal()
    return first_refusal(why or _bf16_refusal(a, b, True))


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.m_grouped_bf16_gemm_nt_masked",
    takes=_takes_masked_bf16,
    available=CUDA.available,
)
def m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype):
    shape, dtype = masked_signature(a, b, masked_m, out_dtype)
    m_max = a.shape[1]
    if host_readable(masked_m):
        masked_rows(MASKED, masked_m, m_max)  # our op's value errors
    counts = _masked_rows(masked_m, m_max)
    d = torch.empty(shape, dtype=dtype, device=a.device)
    CUDA.module().m_grouped_bf16_gemm_nt_masked(a, b, d, counts, m_max)
    return _masked_result(d, counts)


def _k_grouped_refusal(library, cuda: bool, a, b, layout, num_groups: int, psum: bool, alignment: int, dtype):
    """What the k-grouped kernels take (DeepGEMM 2.6.1 ``gemm.hpp`` 303-345, 575-605; DeepGEMM-Ascend ``gemm.hpp``):
    CUDA SM100 only (SM90's need the groups' sizes on the host, ``ks_cpu``, and K-major per-group blocks), psum layouts
    at the library's alignment, contiguous ``[S, M]`` / ``[S, N]`` operands (MN-major, the "tn" form), BF16 or FP32
    out. Ascend: not while a graph is captured (its scheduler takes a group ending before its aligned start as a huge
    unsigned K and reads past A/B, so our layout check, a host read, must run first)."""
    if not (a.shape[0] and a.shape[1] and b.shape[1] and num_groups):
        return "empty operands: nothing to hand the library"
    if cuda:
        why = cuda_refusal()
        if why:
            return why
        if cuda_arch() == SM90:
            return "SM90's k-grouped kernels need the groups' sizes on the host (ks_cpu): a host read"
    elif not host_readable(layout):
        return "a graph is being captured (the layout must be checked on the host before the library reads it)"
    if dtype not in (torch.bfloat16, torch.float32):
        return f"{dtype} output (BF16 or FP32)"
    if not (a.is_contiguous() and b.is_contiguous()):
        return "a or b not contiguous (the tn kernels read [S, M] and [S, N] row-major)"
    why = _alignment_refusal(library, psum, alignment) or real_refusal(a, b)
    return why or (tma_refusal(a=a, b=b) if cuda else None)


def _k_grouped_accumulator(shape, dtype, c, device) -> torch.Tensor:
    """``c`` (or zeros) as the library's ``d``, passed again as its mandatory ``c``: groups with no rows keep it."""
    if c is None:
        return torch.zeros(shape, dtype=dtype, device=device)
    return c.to(dtype=dtype, memory_format=torch.contiguous_format, copy=True)


def _takes_k_grouped_fp8(library, cuda: bool, args) -> str | None:
    a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype = args
    _, dtype = k_grouped_fp8_signature(*args)
    why = _k_grouped_refusal(library, cuda, a, b, layout, num_groups, True, alignment, dtype)
    if why is None and cuda and gran_k not in (32, 128):
        why = f"gran_k {gran_k}: SM100 takes 32 or 128"
    if why is None and cuda and (num_groups > 128 or a.shape[1] % 4 or b.shape[1] % 4):
        why = "more than 128 groups, or M or N not a multiple of 4 (its packed-scale layout)"
    if why is None and cuda and not (sfa.is_contiguous() and sfb.is_contiguous()):
        why = "scales not contiguous (its scale packing reads them row-major)"
    if why is None and not cuda and (gran_k % 32 or a.dtype != _FP8 or b.dtype != _FP8):
        why = "not FP8 E4M3 with gran_k a multiple of 32 (DeepGEMM-Ascend's k-grouped scale blocks are 32 rows)"
    return why or scale_refusal(sfa, sfb, library_keeps_fp32=False)


def _takes_k_grouped_fp8_cuda(*call):
    return first_refusal(_takes_k_grouped_fp8(CUDA, True, call))


def _takes_k_grouped_fp8_ascend(*call):
    return first_refusal(_takes_k_grouped_fp8(ASCEND, False, call))


def _absolute_k_blocks(sf, layout, alignment: int, gran_k: int, rows: int) -> torch.Tensor:
    """Our k-grouped scale rows (``ceil(k_g / gran_k)`` per group, one group after another) as DeepGEMM-Ascend lays
    them out: FP32 ``[ceil(rows / 32), cols]``, one row per 32 rows of A / B by absolute position (a group starts
    aligned to 256, so no block straddles two), each holding its ``gran_k`` block's scale; blocks between groups,
    which the library never reads, 1.0. On the device, no host read."""
    ends = layout.long()
    starts = torch.cat([ends.new_zeros(1), (ends[:-1] + alignment - 1) // alignment * alignment])
    blocks = ((ends - starts).clamp(min=0) + gran_k - 1) // gran_k
    first = torch.cumsum(blocks, 0) - blocks
    at = torch.arange(-(-rows // 32), device=sf.device) * 32
    group = torch.searchsorted(ends, at, right=True).clamp(max=ends.shape[0] - 1)
    inside = (at >= starts[group]) & (at < ends[group])
    row = (first[group] + (at - starts[group]) // gran_k).clamp(0, max(sf.shape[0] - 1, 0))
    picked = scales_as_fp32(sf)[row] if sf.shape[0] else sf.new_ones(at.shape[0], sf.shape[1], dtype=torch.float32)
    return torch.where(inside.unsqueeze(1), picked, 1.0)


def _k_grouped_fp8(library, cuda: bool, a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype):
    shape, dtype = k_grouped_fp8_signature(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype)
    rows = a.shape[0]
    if host_readable(layout):
        k_fp8_segments(a, sfa, sfb, layout, num_groups, alignment, gran_k)  # our op's value errors
    d = _k_grouped_accumulator(shape, dtype, c, a.device)
    if cuda:
        sfa, sfb, recipe = scales_as_fp32(sfa), scales_as_fp32(sfb), (1, 1, gran_k)
    else:
        sfa, sfb = (_absolute_k_blocks(sf, layout, alignment, gran_k, rows) for sf in (sfa, sfb))
        recipe = (1, 1, 32)
    library.module().k_grouped_fp8_gemm_tn_contiguous(
        (a, sfa), (b, sfb), d, None, _psum_layout(layout, rows), c=d, recipe=recipe, use_psum_layout=True
    )
    return d


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.k_grouped_fp8_gemm_tn_contiguous (psum)",
    takes=_takes_k_grouped_fp8_cuda,
    available=CUDA.available,
)
def k_grouped_fp8_gemm(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype):
    return _k_grouped_fp8(CUDA, True, a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype)


@kernel(
    "k_grouped_fp8_gemm",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.k_grouped_fp8_gemm_tn_contiguous (Ascend, psum)",
    takes=_takes_k_grouped_fp8_ascend,
    available=ASCEND.available,
)
def k_grouped_fp8_gemm_ascend(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype):
    return _k_grouped_fp8(ASCEND, False, a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype)


def _takes_k_grouped_bf16(library, cuda: bool, args) -> str | None:
    a, b, layout, num_groups, psum, alignment, c, out_dtype = args
    _, dtype = k_grouped_signature(*args)
    why = None if a.dtype == torch.bfloat16 else f"{a.dtype} operands (the library's grouped GEMMs are BF16 or FP8)"
    return why or _k_grouped_refusal(library, cuda, a, b, layout, num_groups, psum, alignment, dtype)


def _takes_k_grouped_bf16_cuda(*call):
    return first_refusal(_takes_k_grouped_bf16(CUDA, True, call))


def _takes_k_grouped_bf16_ascend(*call):
    return first_refusal(_takes_k_grouped_bf16(ASCEND, False, call))


def _k_grouped_bf16(library, a, b, layout, num_groups, psum, alignment, c, out_dtype):
    shape, dtype = k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    rows = a.shape[0]
    if host_readable(layout):
        layout_segments(K_GROUPED, layout, psum, alignment, rows, num_groups)  # our op's value errors
    d = _k_grouped_accumulator(shape, dtype, c, a.device)
    library.module().k_grouped_bf16_gemm_tn_contiguous(
        a, b, d, None, _psum_layout(layout, rows), c=d, use_psum_layout=True
    )
    return d


@kernel(
    device="cuda",
    library="deep_gemm",
    calls="deep_gemm.k_grouped_bf16_gemm_tn_contiguous (psum)",
    takes=_takes_k_grouped_bf16_cuda,
    available=CUDA.available,
)
def k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    return _k_grouped_bf16(CUDA, a, b, layout, num_groups, psum, alignment, c, out_dtype)


@kernel(
    "k_grouped_bf16_gemm",
    device="npu",
    library="deep_gemm",
    calls="deep_gemm.k_grouped_bf16_gemm_tn_contiguous (Ascend, psum)",
    takes=_takes_k_grouped_bf16_ascend,
    available=ASCEND.available,
)
def k_grouped_bf16_gemm_ascend(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    return _k_grouped_bf16(ASCEND, a, b, layout, num_groups, psum, alignment, c, out_dtype)
