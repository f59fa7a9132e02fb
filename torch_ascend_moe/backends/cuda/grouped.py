"""CUDA kernels of the grouped family: one ``torch._grouped_mm`` (PyTorch's grouped GEMM: CUTLASS on sm90+, a
per-group loop elsewhere) per call instead of the portable kernel's host loop over expert segments, with every
layout mapped on the device, so a call makes no host sync (CUDA-graph capturable) beyond our op's value checks,
which are skipped while a graph is captured (``distributed.capture``).

Mappings (``_grouped_mm``'s groups are contiguous and, here, cover every row; its FP32 accumulation is rounded
once to BF16):

* ``m_grouped_bf16_gemm``: ``_grouped_mm(a [M, K], b.transpose(1, 2) [G, K, N], offs)`` with ``offs`` =
  ``portable.covering_psum_groups`` (psum) or the ends of the rows stably sorted by id (ids; put back in place by
  an ``index_copy``); rows no group owns are computed, then zeroed (a select: inf/NaN in padding rows cannot
  leak).
* ``m_grouped_bf16_gemm_masked``: ``_grouped_mm(a [G, M_max, K], b.transpose(1, 2))`` (3-D x 3-D, a batched
  GEMM), rows at or beyond ``masked_m[g]`` zeroed.
* ``k_grouped_bf16_gemm``: ``_grouped_mm(a.T [M, S], b [S, N], offs)`` (2-D x 2-D: groups along the reduction),
  padding rows zeroed in both operands first (0 * inf is NaN); ``c`` added in FP32 before one rounding needs an
  FP32 output, which ``_grouped_mm`` does not give (``out_dtype`` must be BF16), so calls with ``c`` are portable.

* ``m_grouped_fp8_gemm`` (psum and id layouts) and ``m_grouped_fp8_gemm_masked``: one launch of the block-scaled
  Triton kernel of ``fp8_gemm`` (``_scaled_gemm``; ``_scaled_grouped_mm`` scales per row / per tensor, not
  DeepGEMM's per-K blocks) over a tile schedule built on the device from the layout: psum segments as above, id
  layouts through a row map sorted by group (rows read and written in place), masked groups as ``[0,
  masked_m[g])`` of each batch.

Refused (the chain's next kernel takes them), and why: for ``_grouped_mm``, GPUs before sm90 (not assumed to have
the fused kernel), dtypes other than BF16 in and out (its meta accepts nothing else), rows or columns whose byte
strides are not multiples of 16 (its alignment rule: K and N multiples of 8 for BF16), empty operands; for the
Triton kernel, what ``fp8_gemm``'s CUDA kernel refuses (before sm89, recipes without a common K chunk, no Triton).

* ``k_grouped_fp8_gemm`` (the experts' weight gradients): one launch of ``_k_grouped`` (a program per group and
  output tile walks the group's ``gran_k``-row blocks, each an FP8 dot scaled per column as DeepGEMM does; group
  bounds and scale rows read on the device); ``gran_k`` a power of two in [32, 256], else portable.
* ``m_grouped_fp8_quant_gemm``: one launch of ``_scaled_gemm`` with the per-token cast in the tile (as
  ``fp8_quant_gemm``'s: the GEMM's K chunk is the cast's block; bit for bit the cast then the grouped GEMM, no FP8
  copy of ``x``), the same device-built tile schedule; other recipes run the portable kernel: the cast and the
  grouped GEMM through the dispatcher, each on its own CUDA chain.
* ``m_grouped_fp8_linear``: no kernel here: the portable kernel's steps go through the dispatcher (the casts' and
  ``m_grouped_fp8_gemm``'s CUDA chains, every expert's weight cast in one launch), so no host loop remains.
* ``m_grouped_bf16_gemm_swiglu``: one launch of ``_swiglu`` (the L1 grouped GEMM with the SwiGLU(-quant) epilogue in
  registers, the same device-built tile schedule as the FP8 kernel), after a prefill of the rows no expert owns;
  portable (``_grouped_mm`` then elementwise ops) for FP64, an FP64 output, quantization groups that are not a power
  of two in [16, 128], GPUs before sm80, empty operands.
* ``m_grouped_fp8_gemm_swiglu``: portable: the block-scaled Triton ``m_grouped_fp8_gemm`` through the dispatcher,
  then the epilogue as elementwise ops (the ``[M, 2I]`` BF16 L1 output exists on the GPU; no fused kernel yet).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.cuda import triton_available, triton_module
from torch_ascend_moe.backends.cuda.fp8_linear import cast_in_tile_refusal
from torch_ascend_moe.backends.portable import grouped as portable
from torch_ascend_moe.checks.grouped import (
    K_GROUPED,
    M_GROUPED,
    M_GROUPED_FP8,
    MASKED,
    MASKED_FP8,
    QUANT_FP8,
    SWIGLU,
    k_fp8_segments,
    k_grouped_fp8_signature,
    k_grouped_signature,
    layout_segments,
    m_grouped_fp8_quant_signature,
    m_grouped_fp8_signature,
    m_grouped_signature,
    masked_fp8_signature,
    masked_rows,
    masked_signature,
    swiglu_signature,
)
from torch_ascend_moe.distributed.capture import host_readable

_scaled_gemm = triton_module("_scaled_gemm")
_k_grouped = triton_module("_k_grouped")
_swiglu = triton_module("_swiglu")

_ALIGN = 8  # BF16 elements in 16 bytes: _grouped_mm's stride alignment


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` row-major with a 16-byte aligned start (``_grouped_mm`` checks the data pointer; a view's storage
    offset can break it, a fresh allocation cannot)."""
    t = t.contiguous()
    return t if t.storage_offset() * t.element_size() % 16 == 0 else t.clone()


def _grouped_mm_refusal(a, b, *, dtype: torch.dtype, counts: tuple[int, ...], strided: tuple[int, ...]) -> str | None:
    """Why ``torch._grouped_mm`` does not take a call, or None: BF16 operands and output, positive ``counts`` (rows,
    groups), ``strided`` dims that are positive multiples of 8 (its 16-byte stride rule), on a device whose
    ``_grouped_mm`` is the fused kernel: sm90+ (CUTLASS; older GPUs are not assumed to have it) or CPU (torch's
    composite kernel, what the tests run)."""
    if dtype != torch.bfloat16 or a.dtype != torch.bfloat16 or b.dtype != torch.bfloat16:
        return "not BF16 operands and output (its meta accepts nothing else)"
    if not all(counts):
        return "empty operands: nothing to launch"
    if any(d <= 0 or d % _ALIGN for d in strided):
        return f"K and N {list(strided)}: not positive multiples of {_ALIGN} (its 16-byte stride rule)"
    device = a.device
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        return "GPUs before sm90 are not assumed to have the fused kernel"
    return None


def _takes_m_grouped(a, b, layout, psum, alignment, out_dtype):
    _, dtype = m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
    strided = (a.shape[1], b.shape[1])
    return first_refusal(_grouped_mm_refusal(a, b, dtype=dtype, counts=(a.shape[0], b.shape[0]), strided=strided))


def _takes_masked(a, b, masked_m, out_dtype):
    _, dtype = masked_signature(a, b, masked_m, out_dtype)
    groups, m_max, k = a.shape
    return first_refusal(_grouped_mm_refusal(a, b, dtype=dtype, counts=(groups, m_max), strided=(k, b.shape[1])))


def _takes_k_grouped(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    _, dtype = k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    with_c = (
        "c given: its FP32 sum before one rounding needs an FP32 output, which _grouped_mm lacks"
        if c is not None
        else None
    )
    strided = (a.shape[1], b.shape[1])
    refusal = _grouped_mm_refusal(a, b, dtype=dtype, counts=(a.shape[0], num_groups), strided=strided)
    return first_refusal(with_c, refusal)


@kernel(device="cuda", library="aten", calls="torch._grouped_mm", takes=_takes_m_grouped)
def m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype):
    _, dtype = m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
    rows, groups = a.shape[0], b.shape[0]
    if host_readable(layout):
        layout_segments(M_GROUPED, layout, psum, alignment, rows, groups)  # our op's value errors
    x, w = _rows(a), _rows(b).transpose(1, 2)  # row-major A, column-major [G, K, N] B
    if psum:
        ends, valid = portable.covering_psum_groups(layout, alignment, rows)
        y = torch._grouped_mm(x, w, offs=ends.int())
    else:
        perm, ends, _ = portable.sorted_id_groups(layout, groups)
        y = torch.empty(rows, b.shape[1], dtype=dtype, device=a.device)
        y.index_copy_(0, perm, torch._grouped_mm(x.index_select(0, perm), w, offs=ends.int()))
        valid = layout >= 0
    return torch.where(valid.unsqueeze(1), y, 0)


@kernel(device="cuda", library="aten", calls="torch._grouped_mm", takes=_takes_masked)
def m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype):
    m_max = a.shape[1]
    if host_readable(masked_m):
        masked_rows(MASKED, masked_m, m_max)  # our op's value errors
    y = torch._grouped_mm(_rows(a), _rows(b).transpose(1, 2))
    valid = torch.arange(m_max, device=a.device).unsqueeze(0) < masked_m.unsqueeze(1)
    return torch.where(valid.unsqueeze(2), y, 0)


@kernel(device="cuda", library="aten", calls="torch._grouped_mm", takes=_takes_k_grouped)
def k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    rows = a.shape[0]
    if host_readable(layout):
        layout_segments(K_GROUPED, layout, psum, alignment, rows, num_groups)  # our op's value errors
    if psum:
        ends, valid = portable.covering_psum_groups(layout, alignment, rows)
    else:
        perm, ends, valid = portable.sorted_id_groups(layout, num_groups)
        a, b = a.index_select(0, perm), b.index_select(0, perm)
    # Padding rows: zero in both operands (0 * inf would be NaN). _grouped_mm's 2-D x 2-D form groups the
    # reduction: mat_a [M, S] (a.T of a row-major copy), mat_b [S, N] row-major.
    a, b = (_rows(torch.where(valid.unsqueeze(1), t, 0)) for t in (a, b))
    return torch._grouped_mm(a.T, b, offs=ends.int())


def _id_segments(layout: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(int32 row map sorting rows by group, int64 begins, ends of each group in it) of an id layout, on the
    device; padding rows (and, unvalidated while capturing, ids outside ``[0, G)``) sort past the last group."""
    ids = layout.long()
    key = torch.where((ids >= 0) & (ids < groups), ids, groups)
    key, perm = torch.sort(key, stable=True)
    bounds = torch.searchsorted(key, torch.arange(groups + 1, device=layout.device))
    return perm.int(), bounds[:-1], bounds[1:]


def _tile_schedule(op: str, layout, psum: bool, alignment: int, rows: int, groups: int):
    """(``_scaled_gemm.segment_tiles``' schedule, row map or None) of an m-grouped layout, built on the device; the
    layout's values checked under ``op``'s name first, except while capturing (a host read)."""
    if host_readable(layout):
        layout_segments(op, layout, psum, alignment, rows, groups)  # our op's value errors
    rows_map = None
    if psum:
        begins, ends = (t.clamp(0, rows) for t in portable.psum_segments(layout, alignment))
    else:
        rows_map, begins, ends = _id_segments(layout, groups)
    return _scaled_gemm.segment_tiles(begins, ends, rows), rows_map


def _empty(*sizes: int) -> str | None:
    return "empty operands: nothing to launch" if not all(sizes) else None


def _takes_m_grouped_fp8(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    m_grouped_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)
    return first_refusal(_empty(a.shape[0], b.shape[0], b.shape[1]), _scaled_gemm.refusal(a, recipe_a, recipe_b))


def _takes_masked_fp8(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
    masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
    return first_refusal(_empty(a.shape[0], a.shape[1], b.shape[1]), _scaled_gemm.refusal(a, recipe_a, recipe_b))


@kernel(device="cuda", library="triton", calls="_scaled_gemm", takes=_takes_m_grouped_fp8, available=triton_available)
def m_grouped_fp8_gemm(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    shape, dtype = m_grouped_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)
    tiles, rows_map = _tile_schedule(M_GROUPED_FP8, layout, psum, alignment, a.shape[0], b.shape[0])
    out = torch.zeros(shape, dtype=dtype, device=a.device)
    return _scaled_gemm.scaled_gemm(a, sfa, b, sfb, recipe_a, recipe_b, out, tiles, rows_map=rows_map)


@kernel(device="cuda", library="triton", calls="_scaled_gemm", takes=_takes_masked_fp8, available=triton_available)
def m_grouped_fp8_gemm_masked(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
    shape, dtype = masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
    groups, m_max = a.shape[0], a.shape[1]
    if host_readable(masked_m):
        masked_rows(MASKED_FP8, masked_m, m_max)  # our op's value errors
    ends = masked_m.long().clamp(0, m_max)  # unvalidated while capturing: never past the batch
    tiles = _scaled_gemm.segment_tiles(torch.zeros_like(ends), ends, groups * m_max)
    out = torch.zeros(shape, dtype=dtype, device=a.device)
    return _scaled_gemm.scaled_gemm(a, sfa, b, sfb, recipe_a, recipe_b, out, tiles, a_batched=True)


def _takes_quant_gemm(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, use_ue8m0, out_dtype):
    m_grouped_fp8_quant_signature(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, out_dtype)
    return first_refusal(cast_in_tile_refusal(x, b, [1, gran_k], recipe_b))


@kernel(
    device="cuda",
    library="triton",
    calls="_scaled_gemm with the cast in the tile",
    takes=_takes_quant_gemm,
    available=triton_available,
)
def m_grouped_fp8_quant_gemm(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, use_ue8m0, out_dtype):
    shape, dtype = m_grouped_fp8_quant_signature(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, out_dtype)
    tiles, rows_map = _tile_schedule(QUANT_FP8, layout, psum, alignment, x.shape[0], b.shape[0])
    out = torch.zeros(shape, dtype=dtype, device=x.device)
    return _scaled_gemm.scaled_gemm(
        x, None, b, sfb, [1, gran_k], recipe_b, out, tiles, rows_map=rows_map, quantize_a_ue8m0=use_ue8m0
    )


def _takes_k_grouped_fp8(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype):
    k_grouped_fp8_signature(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype)
    return first_refusal(_empty(a.shape[0], num_groups, a.shape[1], b.shape[1]), _k_grouped.refusal(a, gran_k))


@kernel(device="cuda", library="triton", calls="_k_grouped", takes=_takes_k_grouped_fp8, available=triton_available)
def k_grouped_fp8_gemm(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype):
    shape, dtype = k_grouped_fp8_signature(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype)
    rows = a.shape[0]
    if host_readable(layout):
        k_fp8_segments(a, sfa, sfb, layout, num_groups, alignment, gran_k)  # our op's value errors
    begins, ends = (t.clamp(0, rows) for t in portable.psum_segments(layout, alignment))
    blocks = ((ends - begins).clamp(min=0) + gran_k - 1) // gran_k
    first_scale_row = torch.cumsum(blocks, 0) - blocks
    out = torch.empty(shape, dtype=dtype, device=a.device)
    return _k_grouped.k_grouped(a, sfa, b, sfb, begins, ends, first_scale_row, gran_k, out, c)


def _takes_swiglu(a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype):
    shape, _, dtype = swiglu_signature(
        a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype
    )
    fp64 = "an FP64 output (the kernel sums in FP32)" if dtype == torch.float64 else None
    empty = _empty(a.shape[0], b.shape[0], shape[1], a.shape[1])
    return first_refusal(empty, fp64, _swiglu.refusal(a, quant_gran_k))


@kernel(device="cuda", library="triton", calls="_swiglu", takes=_takes_swiglu, available=triton_available)
def m_grouped_bf16_gemm_swiglu(
    a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype
):
    args = (a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype)
    shape, _, dtype = swiglu_signature(*args)
    rows, groups = a.shape[0], b.shape[0]
    tiles, rows_map = _tile_schedule(SWIGLU, layout, psum, alignment, rows, groups)
    out, scales = _swiglu.prefill(rows, shape[1], row_weights, quant_gran_k, use_ue8m0, dtype, a.device)
    _swiglu.swiglu_gemm(
        a, b, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out, scales, tiles, rows_map=rows_map
    )
    return out, scales
