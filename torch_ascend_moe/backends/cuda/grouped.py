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

Portable, and why: for ``_grouped_mm``, GPUs before sm90 (not assumed to have the fused kernel), dtypes other
than BF16 in and out (its meta accepts nothing else), rows or columns whose byte strides are not multiples of 16
(its alignment rule: K and N multiples of 8 for BF16), empty operands; for the Triton kernel, what ``fp8_gemm``'s
CUDA kernel leaves portable (before sm89, recipes without a common K chunk, no Triton).

* ``k_grouped_fp8_gemm`` (the experts' weight gradients): one launch of ``_k_grouped`` (a program per group and
  output tile walks the group's ``gran_k``-row blocks, each an FP8 dot scaled per column as DeepGEMM does; group
  bounds and scale rows read on the device); ``gran_k`` a power of two in [32, 256], else portable.
* ``m_grouped_fp8_quant_gemm``: one launch of ``_scaled_gemm`` with the per-token cast in the tile (as
  ``fp8_quant_gemm``'s: the GEMM's K chunk is the cast's block; bit for bit the cast then the grouped GEMM, no FP8
  copy of ``x``), the same device-built tile schedule; other recipes run its steps through the dispatcher.
* ``m_grouped_fp8_linear``: its steps through the dispatcher (``portable.m_grouped_fp8_linear_steps``: the casts'
  and ``m_grouped_fp8_gemm``'s CUDA kernels, every expert's weight cast in one launch), so no host loop remains.
* ``m_grouped_bf16_gemm_swiglu``: one launch of ``_swiglu`` (the L1 grouped GEMM with the SwiGLU(-quant) epilogue in
  registers, the same device-built tile schedule as the FP8 kernel), after a prefill of the rows no expert owns;
  portable (``_grouped_mm`` then elementwise ops) for FP64, an FP64 output, quantization groups that are not a power
  of two in [16, 128], GPUs before sm80, empty operands.
* ``m_grouped_fp8_gemm_swiglu``: portable: the block-scaled Triton ``m_grouped_fp8_gemm`` through the dispatcher,
  then the epilogue as elementwise ops (the ``[M, 2I]`` BF16 L1 output exists on the GPU; no fused kernel yet).
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import cuda_kernel
from torch_ascend_moe.backends.cuda.fp8_linear import casts_in_tile
from torch_ascend_moe.backends.portable import grouped as portable
from torch_ascend_moe.distributed.capture import host_readable
from torch_ascend_moe.meta.grouped import (
    K_GROUPED,
    K_GROUPED_FP8,
    M_GROUPED,
    M_GROUPED_FP8,
    MASKED,
    MASKED_FP8,
    QUANT_FP8,
    SWIGLU,
    k_grouped_fp8_signature,
    k_grouped_signature,
    layout_segments,
    m_grouped_fp8_quant_signature,
    m_grouped_fp8_signature,
    m_grouped_signature,
    masked_fp8_signature,
    masked_signature,
    swiglu_signature,
)

try:
    from torch_ascend_moe.backends.cuda import _k_grouped, _scaled_gemm, _swiglu
except ImportError:  # no triton: the portable kernels serve CUDA
    _k_grouped = _scaled_gemm = _swiglu = None

_ALIGN = 8  # BF16 elements in 16 bytes: _grouped_mm's stride alignment


def _aligned(*dims: int) -> bool:
    return all(d % _ALIGN == 0 and d > 0 for d in dims)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` row-major with a 16-byte aligned start (``_grouped_mm`` checks the data pointer; a view's storage
    offset can break it, a fresh allocation cannot)."""
    t = t.contiguous()
    return t if t.storage_offset() * t.element_size() % 16 == 0 else t.clone()


def _bf16(*tensors: torch.Tensor, dtype: torch.dtype) -> bool:
    """BF16 operands and output, on a device whose ``_grouped_mm`` is the fused kernel: sm90+ (CUTLASS; older GPUs
    are not assumed to have it) or CPU (torch's composite kernel, what the tests run)."""
    device = tensors[0].device
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (9, 0):
        return False
    return dtype == torch.bfloat16 and all(t.dtype == torch.bfloat16 for t in tensors)


@cuda_kernel(calls="torch._grouped_mm")
def m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype):
    _, dtype = m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
    rows, groups = a.shape[0], b.shape[0]
    if not (_bf16(a, b, dtype=dtype) and _aligned(a.shape[1], b.shape[1]) and rows and groups):
        return portable.m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype)
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


@cuda_kernel(calls="torch._grouped_mm")
def m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype):
    _, dtype = masked_signature(a, b, masked_m, out_dtype)
    groups, m_max, k = a.shape
    if not (_bf16(a, b, dtype=dtype) and _aligned(k, b.shape[1]) and groups and m_max):
        return portable.m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype)
    if host_readable(masked_m):
        portable._masked_rows(MASKED, masked_m, m_max)  # our op's value errors
    y = torch._grouped_mm(_rows(a), _rows(b).transpose(1, 2))
    valid = torch.arange(m_max, device=a.device).unsqueeze(0) < masked_m.unsqueeze(1)
    return torch.where(valid.unsqueeze(2), y, 0)


@cuda_kernel(calls="torch._grouped_mm")
def k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    _, dtype = k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    rows = a.shape[0]
    usable = _bf16(a, b, dtype=dtype) and c is None and _aligned(a.shape[1], b.shape[1]) and rows and num_groups
    if not usable:
        return portable.k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype)
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


if _scaled_gemm is not None:

    @cuda_kernel(calls="triton: _scaled_gemm")
    def m_grouped_fp8_gemm(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
        shape, dtype = m_grouped_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)
        rows, groups = a.shape[0], b.shape[0]
        if not (rows and groups and b.shape[1] and _scaled_gemm.usable(a, recipe_a, recipe_b)):
            return portable.m_grouped_fp8_gemm(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)
        tiles, rows_map = _tile_schedule(M_GROUPED_FP8, layout, psum, alignment, rows, groups)
        out = torch.zeros(shape, dtype=dtype, device=a.device)
        return _scaled_gemm.scaled_gemm(a, sfa, b, sfb, recipe_a, recipe_b, out, tiles, rows_map=rows_map)

    @cuda_kernel(calls="triton: _scaled_gemm")
    def m_grouped_fp8_gemm_masked(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
        shape, dtype = masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
        groups, m_max = a.shape[0], a.shape[1]
        if not (groups and m_max and b.shape[1] and _scaled_gemm.usable(a, recipe_a, recipe_b)):
            return portable.m_grouped_fp8_gemm_masked(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
        if host_readable(masked_m):
            portable._masked_rows(MASKED_FP8, masked_m, m_max)  # our op's value errors
        ends = masked_m.long().clamp(0, m_max)  # unvalidated while capturing: never past the batch
        tiles = _scaled_gemm.segment_tiles(torch.zeros_like(ends), ends, groups * m_max)
        out = torch.zeros(shape, dtype=dtype, device=a.device)
        return _scaled_gemm.scaled_gemm(a, sfa, b, sfb, recipe_a, recipe_b, out, tiles, a_batched=True)


# The ops the steps call: the dispatcher (a CUDA tensor reaches each step's CUDA kernel); the tests put the CUDA
# kernels themselves here, as the dispatcher would route CUDA tensors to them, to run the composition on CPU.
OPS = torch.ops.ascend_moe


@cuda_kernel(calls="quantize_fp8 -> m_grouped_fp8_gemm (triton: _scaled_gemm)")
def m_grouped_fp8_linear(x, weight, layout, psum, alignment, block, use_ue8m0, fp8_backward):
    return portable.m_grouped_fp8_linear_steps(OPS, x, weight, layout, psum, alignment, block, use_ue8m0)


@cuda_kernel(calls="triton: _scaled_gemm with the cast in the tile | quantize_fp8 -> m_grouped_fp8_gemm")
def m_grouped_fp8_quant_gemm(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, use_ue8m0, out_dtype):
    args = (x, b, sfb, layout, psum, alignment, gran_k, recipe_b, use_ue8m0, out_dtype)
    shape, dtype = m_grouped_fp8_quant_signature(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, out_dtype)
    recipe_a = [1, gran_k]
    if not casts_in_tile(x, b, recipe_a, recipe_b):  # (also: no rows, no experts)
        return portable.m_grouped_fp8_quant_gemm_steps(OPS, *args)
    tiles, rows_map = _tile_schedule(QUANT_FP8, layout, psum, alignment, x.shape[0], b.shape[0])
    out = torch.zeros(shape, dtype=dtype, device=x.device)
    return _scaled_gemm.scaled_gemm(
        x, None, b, sfb, recipe_a, recipe_b, out, tiles, rows_map=rows_map, quantize_a_ue8m0=use_ue8m0
    )


if _k_grouped is not None:

    @cuda_kernel(calls="triton: _k_grouped")
    def k_grouped_fp8_gemm(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype):
        args = (a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype)
        shape, dtype = k_grouped_fp8_signature(*args)
        rows = a.shape[0]
        if not (rows and num_groups and a.shape[1] and b.shape[1] and _k_grouped.usable(a, gran_k)):
            return portable.k_grouped_fp8_gemm(*args)
        if host_readable(layout):  # our op's value errors
            segments = layout_segments(K_GROUPED_FP8, layout, True, alignment, rows, num_groups)
            portable.check_k_fp8_scale_rows(segments, gran_k, sfa, sfb)
        begins, ends = (t.clamp(0, rows) for t in portable.psum_segments(layout, alignment))
        blocks = ((ends - begins).clamp(min=0) + gran_k - 1) // gran_k
        first_scale_row = torch.cumsum(blocks, 0) - blocks
        out = torch.empty(shape, dtype=dtype, device=a.device)
        return _k_grouped.k_grouped(a, sfa, b, sfb, begins, ends, first_scale_row, gran_k, out, c)


if _swiglu is not None:

    @cuda_kernel(calls="triton: _swiglu")
    def m_grouped_bf16_gemm_swiglu(
        a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype
    ):
        args = (a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype)
        shape, _, dtype = swiglu_signature(*args)
        rows, groups = a.shape[0], b.shape[0]
        usable = _swiglu.usable(a, quant_gran_k) and dtype != torch.float64
        if not (rows and groups and shape[1] and a.shape[1] and usable):
            return portable.m_grouped_bf16_gemm_swiglu(*args)
        tiles, rows_map = _tile_schedule(SWIGLU, layout, psum, alignment, rows, groups)
        out, scales = _swiglu.prefill(rows, shape[1], row_weights, quant_gran_k, use_ue8m0, dtype, a.device)
        _swiglu.swiglu_gemm(
            a, b, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out, scales, tiles, rows_map=rows_map
        )
        return out, scales
