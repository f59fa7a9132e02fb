"""Device-generic grouped GEMMs: one portable ``bf16_gemm`` per expert segment.

The loop is over segments read from the layout on the host (a device sync on accelerators); a device's
fused grouped kernel (``torch._grouped_mm`` on CUDA, ``npu_grouped_matmul`` on Ascend, DeepGEMM's) comes first in
its chain where one exists. ``m_grouped_fp8_linear`` / ``m_grouped_fp8_quant_gemm`` are their casts and grouped
GEMM through the dispatcher (each step reaches the device's own chain; no host loop).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.backends.portable.fp8_gemm import fp8_gemm
from torch_ascend_moe.backends.portable.gemm import bf16_gemm
from torch_ascend_moe.checks.grouped import (
    K_GROUPED,
    LINEAR_FP8,
    M_GROUPED,
    M_GROUPED_FP8,
    MASKED,
    MASKED_FP8,
    QUANT_FP8,
    SWIGLU,
    SWIGLU_FP8,
    k_fp8_segments,
    k_grouped_fp8_signature,
    k_grouped_signature,
    layout_segments,
    m_grouped_fp8_linear_signature,
    m_grouped_fp8_quant_signature,
    m_grouped_fp8_signature,
    m_grouped_signature,
    masked_fp8_signature,
    masked_rows,
    masked_signature,
    swiglu_fp8_signature,
    swiglu_signature,
)
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.quant import reference

ops = torch.ops.ascend_moe


def psum_segments(layout: torch.Tensor, alignment: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 (begins, ends) of a psum layout's groups, on the device: group g owns ``[align(layout[g-1]),
    layout[g])`` (``layout_segments`` without the host read)."""
    ends = layout.long()
    prev = torch.cat([ends.new_zeros(1), ends[:-1]])
    return (prev + alignment - 1) // alignment * alignment, ends


def covering_psum_groups(layout: torch.Tensor, alignment: int, rows: int):
    """(int64 cumulative ends covering every row, bool mask of the rows some group owns) of a psum layout, on the
    device (no host read): the contiguous groups a fused grouped GEMM takes (``npu_grouped_matmul``'s
    ``group_list``, ``torch._grouped_mm``'s ``offs``), the padding before an aligned start given to the previous
    group (computed, then zeroed by the caller through the mask)."""
    starts, ends = psum_segments(layout, alignment)
    cum = torch.cat([starts[1:], ends.new_full((1,), rows)])
    r = torch.arange(rows, device=layout.device)
    group = torch.searchsorted(cum, r, right=True).clamp(max=ends.numel() - 1)
    return cum, r < ends[group]


def sorted_id_groups(layout: torch.Tensor, groups: int):
    """(stable permutation sorting rows by group, int64 cumulative ends of the sorted rows, bool mask of the
    sorted rows that are not padding) of a per-row id layout, on the device; padding rows sort with group 0."""
    ids = layout.long()
    key, perm = torch.sort(ids.clamp(min=0), stable=True)
    cum = torch.searchsorted(key, torch.arange(groups, device=layout.device), right=True)
    return perm, cum, ids.index_select(0, perm) >= 0


@portable_kernel
def m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype):
    shape, dtype = m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
    out = torch.zeros(shape, dtype=dtype, device=a.device)
    for g, begin, end in layout_segments(M_GROUPED, layout, psum, alignment, a.shape[0], b.shape[0]):
        if end > begin:
            out[begin:end] = bf16_gemm(a[begin:end], b[g], None, 1.0, dtype)
    return out


@portable_kernel
def m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype):
    shape, dtype = masked_signature(a, b, masked_m, out_dtype)
    out = torch.zeros(shape, dtype=dtype, device=a.device)
    for g, m in enumerate(masked_rows(MASKED, masked_m, a.shape[1])):
        if m:
            out[g, :m] = bf16_gemm(a[g, :m], b[g], None, 1.0, dtype)
    return out


@portable_kernel
def m_grouped_fp8_gemm(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    shape, dtype = m_grouped_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)
    out = torch.zeros(shape, dtype=dtype, device=a.device)
    for g, begin, end in layout_segments(M_GROUPED_FP8, layout, psum, alignment, a.shape[0], b.shape[0]):
        if end > begin:
            out[begin:end] = fp8_gemm(a[begin:end], sfa[begin:end], b[g], sfb[g], None, recipe_a, recipe_b, 1.0, dtype)
    return out


@portable_kernel
def m_grouped_fp8_gemm_masked(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
    shape, dtype = masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
    out = torch.zeros(shape, dtype=dtype, device=a.device)
    for g, m in enumerate(masked_rows(MASKED_FP8, masked_m, a.shape[1])):
        if m:
            out[g, :m] = fp8_gemm(a[g, :m], sfa[g, :m], b[g], sfb[g], None, recipe_a, recipe_b, 1.0, dtype)
    return out


@portable_kernel
def k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    shape, dtype = k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    acc_t = torch.float64 if a.dtype == torch.float64 else torch.float32
    # Row-major whatever c's strides (the fake's layout).
    acc = (
        c.to(acc_t, copy=True, memory_format=torch.contiguous_format)
        if c is not None
        else torch.zeros(shape, dtype=acc_t, device=a.device)
    )
    for g, begin, end in layout_segments(K_GROUPED, layout, psum, alignment, a.shape[0], num_groups):
        if end > begin:
            acc[g] += a[begin:end].to(acc_t).T @ b[begin:end].to(acc_t)
    return acc.to(dtype)


@portable_kernel
def m_grouped_fp8_linear(x, weight, layout, psum, alignment, block, use_ue8m0, fp8_backward):
    """The forward as op calls through the dispatcher (each device's casts and grouped FP8 GEMM, no host loop):
    ``x`` cast per token, every expert's weight in one cast (``[G, N, K]`` as ``[G * N', K]`` with ``N``
    zero-padded to ``N'``, a multiple of ``block``, so no tile straddles two experts: zero rows change no tile's
    amax, the same codes and scales as one cast per expert), then ``m_grouped_fp8_gemm``. BF16 ``x`` asks the GEMM
    for BF16 directly (the FP32 sum rounded once: the same bits as FP32 then ``.to``). The layout's values are checked
    under this op's name first, except while capturing (a host read)."""
    m_grouped_fp8_linear_signature(x, weight, layout, psum, alignment, block)
    if capture.host_readable(layout):
        layout_segments(LINEAR_FP8, layout, psum, alignment, x.shape[0], weight.shape[0])  # our op's value errors
    groups, n, k = weight.shape
    xq, xs = ops.quantize_fp8(x, [1, block], use_ue8m0, False)
    n_padded = n + -n % block
    padded = F.pad(weight, (0, 0, 0, n_padded - n)) if n_padded != n else weight
    wq, ws = ops.quantize_fp8(padded.reshape(groups * n_padded, k), [block, block], use_ue8m0, False)
    wq, ws = wq.view(groups, n_padded, k)[:, :n], ws.view(groups, n_padded // block, ws.shape[-1])
    dtype = torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32
    out = ops.m_grouped_fp8_gemm(xq, xs, wq, ws, layout, psum, alignment, [1, block], [block, block], dtype)
    return out.to(x.dtype)


@portable_kernel
def m_grouped_fp8_quant_gemm(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, use_ue8m0, out_dtype):
    """``quantize_fp8(x, [1, gran_k])`` then ``m_grouped_fp8_gemm``, through the dispatcher (each device's cast and
    grouped FP8 GEMM, no host loop). The layout's values are checked under this op's name first, except while
    capturing."""
    _, dtype = m_grouped_fp8_quant_signature(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, out_dtype)
    if capture.host_readable(layout):
        layout_segments(QUANT_FP8, layout, psum, alignment, x.shape[0], b.shape[0])  # our op's value errors
    q, sf = ops.quantize_fp8(x, [1, gran_k], use_ue8m0, False)
    return ops.m_grouped_fp8_gemm(q, sf, b, sfb, layout, psum, alignment, [1, gran_k], recipe_b, dtype)


@portable_kernel
def k_grouped_fp8_gemm(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype):
    shape, dtype = k_grouped_fp8_signature(a, sfa, b, sfb, layout, num_groups, alignment, gran_k, c, out_dtype)
    segments = k_fp8_segments(a, sfa, sfb, layout, num_groups, alignment, gran_k)
    acc = (
        c.to(torch.float32, copy=True, memory_format=torch.contiguous_format)
        if c is not None
        else torch.zeros(shape, dtype=torch.float32, device=a.device)
    )
    row = 0
    for g, begin, end in segments:
        n = end - begin
        if n == 0:
            continue
        blocks = -(-n // gran_k)
        a_g = reference.dequantized(a[begin:end], sfa[row : row + blocks], (gran_k, 1))
        b_g = reference.dequantized(b[begin:end], sfb[row : row + blocks], (gran_k, 1))
        acc[g] += a_g.T @ b_g
        row += blocks
    return acc.to(dtype)


def swiglu_epilogue(h, row_weights, activation_clamp, quant_gran_k, use_ue8m0, dtype):
    """The SwiGLU ops' epilogue on the whole L1 output ``h [M, 2I]`` (the C++ kernels apply the same ATen ops tile
    by tile): ``(out [M, I], scales)``. Differentiable (the ops' backward runs it again)."""
    compute = torch.float64 if h.dtype == torch.float64 else torch.float32
    gate, up = h.to(compute).chunk(2, dim=-1)
    if activation_clamp is not None:
        gate = gate.clamp(max=activation_clamp)
        up = up.clamp(-activation_clamp, activation_clamp)
    act = F.silu(gate) * up
    if row_weights is not None:
        act = act * row_weights.unsqueeze(1)
    if quant_gran_k > 0:
        return reference.quantize_fp8(act, (1, quant_gran_k), use_ue8m0, False)
    return act.to(dtype), act.new_empty((h.shape[0], 0), dtype=torch.float32)


@portable_kernel
def m_grouped_bf16_gemm_swiglu(
    a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype
):
    _, _, dtype = swiglu_signature(
        a, b, layout, psum, alignment, row_weights, activation_clamp, quant_gran_k, use_ue8m0, out_dtype
    )
    if capture.host_readable(layout):  # the layout's values, checked under this op's name (not while capturing)
        layout_segments(SWIGLU, layout, psum, alignment, a.shape[0], b.shape[0])
    # The device's grouped GEMM (torch._grouped_mm on CUDA, npu_grouped_matmul on Ascend), then the epilogue.
    h = torch.ops.ascend_moe.m_grouped_bf16_gemm.default(a, b, layout, psum, alignment, None)
    return swiglu_epilogue(h, row_weights, activation_clamp, quant_gran_k, use_ue8m0, dtype)


@portable_kernel
def m_grouped_fp8_gemm_swiglu(
    a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, row_weights, activation_clamp, quant_gran_k,
    use_ue8m0, out_dtype,
):  # fmt: skip
    _, _, dtype = swiglu_fp8_signature(
        a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, row_weights, activation_clamp, quant_gran_k,
        use_ue8m0, out_dtype,
    )  # fmt: skip
    if capture.host_readable(layout):
        layout_segments(SWIGLU_FP8, layout, psum, alignment, a.shape[0], b.shape[0])
    # The device's scaled grouped GEMM (Triton on CUDA, npu_grouped_matmul's MX form on Ascend 950), then the epilogue.
    h = torch.ops.ascend_moe.m_grouped_fp8_gemm.default(
        a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, torch.bfloat16
    )
    return swiglu_epilogue(h, row_weights, activation_clamp, quant_gran_k, use_ue8m0, dtype)
