"""DeepGEMM's scale-factor layout helpers (specs/deepgemm_api.md §11) with upstream semantics.

Kernels read scales MN-major with the MN stride padded to 4 elements (16 bytes, CUDA TMA's rule) and,
on SM100, as UE8M0 exponents packed 4 per int32 along K. These functions produce and validate those
layouts; our GEMM ops accept every layout they return (the values are what matter on CPU), so code that
prepares scales for DeepGEMM runs unchanged. Every FP32 -> UE8M0 step rejects scales that are not
positive powers of two, where a kernel would silently misread them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.deep_gemm.runtime import get_mk_alignment_for_contiguous_layout
from torch_ascend_moe.deep_gemm.utils.math import align, ceil_div
from torch_ascend_moe.quant import pack_ue8m0_to_int


def _mn_major_aligned(sf: torch.Tensor) -> torch.Tensor:
    """Same values, MN-major, MN stride padded to a multiple of 4 elements (padding left unspecified)."""
    *lead, mn, cols = sf.shape
    aligned = align(mn, 4)
    buf = sf.new_empty((*lead, cols, aligned))
    buf[..., :mn].copy_(sf.mT)
    return buf[..., :mn].mT


def _has_mn_major_aligned_layout(sf: torch.Tensor) -> bool:
    """Upstream's TMA stride check on kernel inputs (``check_sf_layout``): only ``mn == 1`` may skip the
    unit MN stride; the K stride is ``align(mn, 4)`` even for one column, so TMA descriptors built from
    the strides stay valid."""
    mn, cols = sf.shape[-2], sf.shape[-1]
    aligned = align(mn, 4)
    ok = (sf.stride(-2) == 1 or mn == 1) and sf.stride(-1) == aligned
    return ok and (sf.dim() == 2 or sf.stride(-3) == aligned * cols)


def _has_exact_mn_major_aligned_strides(sf: torch.Tensor) -> bool:
    """Strides exactly ``([align(mn, 4)*sf_k,] 1, align(mn, 4))``, what the layout helpers return."""
    aligned = align(sf.shape[-2], 4)
    return tuple(sf.stride()) == (aligned * sf.shape[-1], 1, aligned)[3 - sf.dim() :]


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """FP32 ``[mn, sf_k]`` / ``[G, mn, sf_k]`` -> same values with strides ``(align(mn, 4)*sf_k, 1, align(mn, 4))``.

    Returns ``sf`` itself when it already has exactly those strides (size-1 dims included, as upstream).
    """
    api = "get_mn_major_tma_aligned_tensor"
    ck.check_arg(sf.dim() in (2, 3), api, "sf", "rank", "2-D [mn, sf_k] or 3-D [G, mn, sf_k]", sf.dim())
    return sf if _has_exact_mn_major_aligned_strides(sf) else _mn_major_aligned(sf)


def _psum_row_mask(psum_layout: torch.Tensor, rows: int) -> torch.Tensor:
    """Rows inside some group of a psum layout: group g spans [align(end_{g-1}, alignment), end_g)."""
    alignment = get_mk_alignment_for_contiguous_layout()
    ends = psum_layout.to(torch.int64).cpu().tolist()
    mask = torch.zeros(rows, dtype=torch.bool)
    prev = 0
    for end in ends:
        start = align(prev, alignment)
        mask[start : min(end, rows)] = True
        prev = end
    return mask


def get_mn_major_tma_aligned_packed_ue8m0_tensor(
    sf: torch.Tensor, psum_layout: torch.Tensor | None = None
) -> torch.Tensor:
    """FP32 powers of two ``[.., mn, sf_k]`` -> int32 ``[.., mn, ceil(sf_k/4)]``, MN-major, MN stride padded to 4.

    Entry ``[r, i]`` packs the exponents of ``sf[r, 4i..4i+3]`` (a missing tail packs as code 0). With
    ``psum_layout`` (2-D input only) rows outside every group are written as 0 instead of being read.
    """
    api = "get_mn_major_tma_aligned_packed_ue8m0_tensor"
    ck.check_arg(sf.dim() in (2, 3), api, "sf", "rank", "2-D [mn, sf_k] or 3-D [G, mn, sf_k]", sf.dim())
    ck.check_arg(sf.dtype == torch.float32, api, "sf", "dtype", torch.float32, sf.dtype)
    values = sf
    if psum_layout is not None:
        ck.check_arg(sf.dim() == 2, api, "sf", "rank", "2-D when psum_layout is given", sf.dim())
        values = torch.where(_psum_row_mask(psum_layout, sf.shape[0]).to(sf.device)[:, None], sf, 0.0)
    values = torch.nn.functional.pad(values, (0, (-sf.shape[-1]) % 4))
    return _mn_major_aligned(pack_ue8m0_to_int(values))


def get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
    sf: torch.Tensor,
    grouped_layout: torch.Tensor,
    ks_cpu: Sequence[int] | None,
    gran_k: int,
    k_alignment: int,
    use_psum_layout: bool = False,
) -> torch.Tensor:
    """K-grouped per-channel scales: FP32 ``[S, mn]`` (each group's ``ceil(k_g/gran_k)`` rows in a row) ->
    int32 ``[sum_g ceil(k_g / (4*gran_k)), mn]``, packing 4 consecutive rows of one group into one row
    (psum layout without ``ks_cpu``: ``(S + 3G) / 4`` rows, as upstream sizes it, the tail unspecified)."""
    api = "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor"
    ck.check_rank(api, "sf", sf, 2, "[S, mn]")
    ck.check_arg(sf.shape[1] % 4 == 0, api, "sf", "size(1)", "a multiple of 4", sf.shape[1])
    ck.check_arg(gran_k in (32, 128), api, "gran_k", "value", "32 or 128", gran_k)
    ck.check_arg(
        k_alignment % 32 == 0 and k_alignment > 0, api, "k_alignment", "value", "a multiple of 32", k_alignment
    )
    layout = grouped_layout.to(torch.int64).cpu().tolist()
    ck.check_arg(len(layout) <= 128, api, "grouped_layout", "size(0)", "at most 128 groups", len(layout))
    if use_psum_layout:
        starts = [0] + [align(end, k_alignment) for end in layout[:-1]]
        ks = [end - start for start, end in zip(starts, layout)]
    else:
        ks = layout
    # DeepGEMM 2.8 lays the FP32 scales out per physical row block (each group padded to k_alignment); 2.6.1
    # compactly (ceil(k_g / gran_k) rows): told apart by the row count, each group packed from its own rows.
    compact = [ceil_div(k, gran_k) for k in ks]
    padded = [align(k, k_alignment) // gran_k for k in ks]
    counts = padded if sf.shape[0] == sum(padded) and sum(padded) != sum(compact) else compact
    if not use_psum_layout:
        ck.check_arg(
            sf.shape[0] == sum(counts),
            api,
            "sf",
            "size(0)",
            f"{sum(compact)} (sum of ceil(k_g / gran_k)) or {sum(padded)} (2.8: aligned groups)",
            sf.shape[0],
        )
    packed, offset = [], 0
    for n in counts:
        group = sf[offset : offset + n]
        group = torch.nn.functional.pad(group, (0, 0, 0, (-n) % 4))  # the group's last pack: zero codes
        packed.append(pack_ue8m0_to_int(group.T.contiguous()).T)
        offset += n
    out = torch.cat(packed).contiguous() if packed else sf.new_empty((0, sf.shape[1]), dtype=torch.int32)
    if use_psum_layout and not ks_cpu:
        # Without host sizes upstream allocates the upper bound (S + 3G) / 4 rows; the extra rows are unspecified.
        out = torch.nn.functional.pad(out, (0, 0, 0, (sf.shape[0] + 3 * len(layout)) // 4 - out.shape[0]))
    return out


def transform_sf_into_required_layout(
    sf: torch.Tensor,
    mn: int,
    k: int,
    recipe: Sequence[int],
    num_groups: int | None = None,
    is_sfa: bool | None = None,
    disable_ue8m0_cast: bool = False,
    psum_layout: torch.Tensor | None = None,
) -> torch.Tensor:
    """Scales in the layout the kernels read (§11.1), as upstream on SM90 (``disable_ue8m0_cast=True``)
    or SM100 (``False``):

    1. FP32, recipe ``(1, gk)``, ``disable_ue8m0_cast`` -> FP32 MN-major TMA-aligned.
    2. FP32, recipe ``(128, 128)``, ``disable_ue8m0_cast`` -> unchanged (must be contiguous, or contiguous
       after transposing the last two dims).
    3. FP32, ``gk`` in {32, 128}, UE8M0 cast -> rows broadcast to ``mn`` (``sf[i // gran_mn]``), packed
       int32 ``[.., mn, ceil(sf_k/4)]`` MN-major TMA-aligned; the scales must be powers of two.
    4. int32, ``gran_mn == 1``, ``gk`` in {32, 128} -> validated: already MN-major and TMA-aligned.
    """
    api = "transform_sf_into_required_layout"
    if len(recipe) == 3:
        ck.check_arg(is_sfa is not None, api, "is_sfa", "value", "True or False with a 3-tuple recipe", is_sfa)
        gran_mn, gran_k = (recipe[0] if is_sfa else recipe[1]), recipe[2]
    else:
        ck.check_arg(len(recipe) == 2, api, "recipe", "value", "(gran_m, gran_n, gran_k) or (gran_mn, gran_k)", recipe)
        ck.check_arg(is_sfa is None, api, "is_sfa", "value", "None with a 2-tuple recipe", is_sfa)
        gran_mn, gran_k = recipe
    ck.check_arg(sf.dtype in (torch.float32, torch.int32), api, "sf", "dtype", "torch.float32 or torch.int32", sf.dtype)
    rank = 2 + (num_groups is not None)
    ck.check_rank(api, "sf", sf, rank, "[G, MN-blocks, K-blocks]" if rank == 3 else "[MN-blocks, K-blocks]")
    if num_groups is not None:
        ck.check_dim_size(api, "sf", sf, 0, "groups", num_groups, "num_groups")
    per = 4 if sf.dtype == torch.int32 else 1
    ck.check_dim_size(api, "sf", sf, -2, "MN blocks", ceil_div(mn, gran_mn), f"ceil(mn / {gran_mn})")
    ck.check_dim_size(api, "sf", sf, -1, "K blocks", ceil_div(k, gran_k * per), f"ceil(k / {gran_k * per})")
    if sf.dtype == torch.float32 and disable_ue8m0_cast:
        if gran_mn == 1:
            return get_mn_major_tma_aligned_tensor(sf)
        if gran_mn == 128 and gran_k == 128:
            ok = sf.is_contiguous() or sf.mT.is_contiguous()
            ck.check_arg(ok, api, "sf", "layout", "contiguous, or contiguous after .mT", "a strided view")
            return sf
    elif sf.dtype == torch.float32 and gran_k in (32, 128):
        rows = sf.repeat_interleave(gran_mn, dim=-2)[..., :mn, :] if gran_mn != 1 else sf
        return get_mn_major_tma_aligned_packed_ue8m0_tensor(rows, psum_layout)
    elif sf.dtype == torch.int32 and gran_mn == 1 and gran_k in (32, 128):
        ck.check_arg(
            _has_mn_major_aligned_layout(sf),
            api,
            "sf",
            "layout",
            "MN-major with the MN stride padded to a multiple of 4 (get_mn_major_tma_aligned_packed_ue8m0_tensor)",
            lambda: f"strides {tuple(sf.stride())}",
        )
        return sf
    raise ValueError(
        f"{api}: argument 'recipe': expected a supported combination (FP32 (1, gk) or (128, 128) with "
        "disable_ue8m0_cast; FP32 or int32 with gran_k 32 or 128), got "
        f"sf {sf.dtype}, recipe {tuple(recipe)}, disable_ue8m0_cast={disable_ue8m0_cast}"
    )
