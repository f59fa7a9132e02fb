"""Ascend adapters of the grouped family: one ``torch_npu.npu_grouped_matmul`` per call instead of the portable
kernel's one GEMM per expert segment.

Every adapter uses npu_grouped_matmul's "single x, single weight, single y" form (``split_item=3``, one int64
``group_list``). Its groups are contiguous and cover every row (``group_type=0``: cumulative ends whose last value
is ``x.size(0)``), so our layouts are mapped on the device, without a host loop:

* ``psum=True`` (``[align(end[g-1]), end[g])``): the padding rows before a group's aligned start belong to the
  previous group (the ones after the last end to the last group); they are computed and then zeroed in the output
  (m-grouped), or zeroed in both operands before the reduction (k-grouped), so their values never matter.
* ``psum=False`` (one id per row, -1 = padding, ids in any order): rows are stably sorted by group (padding rows
  with group 0), multiplied, and put back in place; padding rows are zeroed as above.
* masked (``[G, M_max, K]``): every group spans ``M_max`` rows; rows at or beyond ``masked_m[g]`` are zeroed in
  the output (computed, never used: their values cannot leak, even when they are inf/NaN).
* k-grouped: ``group_type=2`` with ``x = a.T`` (``[M, S]``, the transposed view torch_npu's K-grouped form takes,
  as MindSpeed's and others' weight gradients call it),
  ``weight = b`` (``[S, N]``), output ``[G, M, N]``; ``c`` is added in FP32 before the one rounding.

Our expert weights ``[G, N, K]`` are passed as the ``[G, K, N]`` view ``b.transpose(1, 2)`` (a "transposed
weight" for torch_npu when ``b`` is K-major, a contiguous one when ``b`` is MN-major).

Output dtype: the kernel's own when it equals the input's; otherwise FP32 (``output_dtype``) rounded once to the
requested dtype. FP64 operands (no Ascend matmul) and shapes beyond the documented limits (``MAX_GROUPS``,
``INNER_LIMIT``) run the portable kernel.

Errors: each adapter runs our op's signature check first and, on real tensors, the layout *value* checks of the
portable kernel (one host read of the layout / ``masked_m``), so a bad input fails with our op's message and
torch_npu never sees an invalid ``group_list``.

GE graph mode (TorchAir): each op's converter builds the same mapping from GE ops (Range, SearchSorted, Sort,
GatherV2, SelectV2) around one ``GroupedMatmul``, through torch_npu's own converter of ``npu_grouped_matmul``;
the id layout is put back in place by gathering with the inverse permutation (TorchAir has no ``index_copy``
converter). Differences GE forces: FP32 output from BF16/FP16 inputs before Ascend 950 (torch_npu's converter
rejects ``output_dtype=float32`` there) multiplies the inputs cast to FP32, which is exact for their values and
still one FP32 accumulation; FP64 and shapes beyond the limits have no graph (a clear error while it is built).

FP8 ops stay on the portable kernels (``m_grouped_fp8_gemm``, ``m_grouped_fp8_gemm_masked``,
``m_grouped_fp8_linear``, ``k_grouped_fp8_gemm``): their scales vary *along K* (1 x gran_k blocks of A, gran_k x
gran_k blocks of B, gran_k row blocks of k-grouped operands, FP32 or UE8M0), while npu_grouped_matmul scales only
after the whole K reduction (``scale [E, N]`` per channel, ``per_token_scale [M]`` per row; A2/A3 docs: no FP8
inputs at all). Its only K-block form is MX on Ascend 950 (``scale_dtype=float8_e8m0fnu``: 1 x 32 blocks with
power-of-two scales): that would be exact only for the UE8M0 recipes with ``gran_k % 32 == 0``, and the MX scale
layout is not documented in torch_npu 2.13's docstrings, so it is not written here.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import npu_ge_converter, npu_kernel
from torch_ascend_moe.backends.npu import ge_graph
from torch_ascend_moe.backends.portable import grouped as portable
from torch_ascend_moe.distributed.capture import host_readable
from torch_ascend_moe.meta.grouped import (
    K_GROUPED,
    M_GROUPED,
    MASKED,
    k_grouped_signature,
    layout_segments,
    m_grouped_signature,
    masked_signature,
)

# torch_npu's group_type values.
M_AXIS, K_AXIS = 0, 2
# group_list_type: 0 = cumulative ends, 1 = per-group counts.
CUMSUM = 0
# torch_npu 2.13's documented limits (A2 docs): at most 1024 groups with a single 3-D weight, and the last
# dimension of x and weight (x: K, or M when transposed; weight: N, or K when transposed) below 65536. A call
# outside them runs the portable kernel.
MAX_GROUPS = 1024
INNER_LIMIT = 65536


def _gmm_with(call, x, weight, group_list, group_type, output_dtype):
    """``npu_grouped_matmul``'s single-tensor form through ``call``: the op itself (eager) or torch_npu's GE
    converter of it (graph mode), which take the same arguments."""
    (y,) = call(
        [x],
        [weight],
        group_list=group_list,
        split_item=3,
        group_type=group_type,
        group_list_type=CUMSUM,
        output_dtype=output_dtype,
    )
    return y


def _gmm(x, weight, group_list, group_type, output_dtype=None):
    """``torch.ops.npu`` is looked up here, at call time (it exists only once torch_npu, or the test wheel's
    schemas, are loaded)."""
    return _gmm_with(torch.ops.npu.npu_grouped_matmul, x, weight, group_list, group_type, output_dtype)


def _fits(groups: int, *inner: int) -> bool:
    return groups <= MAX_GROUPS and all(d < INNER_LIMIT for d in inner)


def _weight_kn(b: torch.Tensor) -> torch.Tensor:
    """``[G, K, N]`` view of our ``[G, N, K]`` weights in a layout torch_npu takes (row-major or transposed)."""
    w = b.transpose(1, 2)
    transposed = w.stride(1) == 1 and w.stride(2) == w.shape[1]
    return w if w.is_contiguous() or transposed else w.contiguous()


def _kernel_dtype(a: torch.Tensor, dtype: torch.dtype) -> torch.dtype | None:
    """``output_dtype`` to request: none when ``dtype`` is the input's, else FP32 (rounded once afterwards)."""
    return None if dtype == a.dtype else torch.float32


@npu_kernel(calls="npu_grouped_matmul")
def m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype):
    shape, dtype = m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
    if a.dtype == torch.float64 or not _fits(b.shape[0], b.shape[1], b.shape[2]):
        return portable.m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype)
    rows, groups = a.shape[0], b.shape[0]
    if host_readable(layout):
        layout_segments(M_GROUPED, layout, psum, alignment, rows, groups)  # our op's value errors
    if rows == 0 or groups == 0 or a.shape[1] == 0 or b.shape[1] == 0:
        return torch.zeros(shape, dtype=dtype, device=a.device)
    x, w = a.contiguous(), _weight_kn(b)
    if psum:
        cum, valid = portable.covering_psum_groups(layout, alignment, rows)
        y = _gmm(x, w, cum, M_AXIS, _kernel_dtype(a, dtype))
    else:
        perm, cum, _ = portable.sorted_id_groups(layout, groups)
        y_sorted = _gmm(x.index_select(0, perm), w, cum, M_AXIS, _kernel_dtype(a, dtype))
        y = torch.empty_like(y_sorted).index_copy_(0, perm, y_sorted)
        valid = layout >= 0
    return y.masked_fill(~valid.unsqueeze(1), 0).to(dtype)


@npu_kernel(calls="npu_grouped_matmul")
def m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype):
    shape, dtype = masked_signature(a, b, masked_m, out_dtype)
    if a.dtype == torch.float64 or not _fits(b.shape[0], b.shape[1], b.shape[2]):
        return portable.m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype)
    groups, m_max, k = a.shape
    if host_readable(masked_m):
        portable._masked_rows(MASKED, masked_m, m_max)  # our op's value errors
    if groups * m_max == 0 or k == 0 or b.shape[1] == 0:
        return torch.zeros(shape, dtype=dtype, device=a.device)
    cum = torch.arange(1, groups + 1, device=a.device) * m_max
    y = _gmm(a.reshape(groups * m_max, k).contiguous(), _weight_kn(b), cum, M_AXIS, _kernel_dtype(a, dtype))
    valid = torch.arange(m_max, device=a.device).unsqueeze(0) < masked_m.unsqueeze(1)
    return y.view(shape).masked_fill(~valid.unsqueeze(2), 0).to(dtype)


@npu_kernel(calls="npu_grouped_matmul")
def k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    shape, dtype = k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    if a.dtype == torch.float64 or not _fits(num_groups, a.shape[1], b.shape[1]):
        return portable.k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    rows = a.shape[0]
    if host_readable(layout):
        layout_segments(K_GROUPED, layout, psum, alignment, rows, num_groups)  # our op's value errors
    if rows == 0 or num_groups == 0 or a.shape[1] == 0 or b.shape[1] == 0:
        out = torch.zeros(shape, dtype=dtype, device=a.device)
        return out if c is None else out.copy_(c)  # row-major, as our op's fake, whatever c's strides
    if psum:
        cum, valid = portable.covering_psum_groups(layout, alignment, rows)
    else:
        perm, cum, valid = portable.sorted_id_groups(layout, num_groups)
        a, b = a.index_select(0, perm), b.index_select(0, perm)
    # Padding rows sit inside a group's contiguous range: zero them in both operands (0 * inf would be NaN).
    # Row-major copies: torch_npu's K-grouped form wants x as the *transposed view* a.T (a contiguous x loses
    # the transpose marker: EZ1001 per users' reports). masked_fill's result is row-major on CPU; .contiguous()
    # makes that a guarantee rather than a property of one backend's masked_fill.
    a, b = (t.masked_fill(~valid.unsqueeze(1), 0).contiguous() for t in (a, b))
    if c is None and dtype == a.dtype:
        return _gmm(a.T, b, cum, K_AXIS)
    y = _gmm(a.T, b, cum, K_AXIS, torch.float32)
    # In place: y's row-major strides, whatever c's; c as FP32 first (an FP8 c would not promote).
    return (y if c is None else y.add_(c.to(torch.float32))).to(dtype)


# ---- TorchAir GE converters ----------------------------------------------------------------------------------


def _gmm_ge(op, x, weight_kn, group_list, group_type, dtype, out_dtype):
    """One ``GroupedMatmul`` (torch_npu's converter of ``npu_grouped_matmul``) of ``dtype`` operands: output in
    ``dtype`` when ``out_dtype`` is it, else in FP32 (to be rounded once to ``out_dtype``): requested from the
    kernel on Ascend 950, or, before it (torch_npu's converter rejects an FP32 request there), the operands cast
    to FP32."""
    if dtype == torch.float64:
        raise ge_graph.unsupported(op, "float64 operands: Ascend has no float64 matmul")
    x, weight_kn = ge_graph.typed(x, dtype), ge_graph.typed(weight_kn, dtype)
    request = None
    if out_dtype != dtype and dtype != torch.float32:  # FP32 operands give FP32 already
        if ge_graph.is_ascend950():
            request = 6  # torch.float32's ScalarType number, as torch_npu's converter compares it
        else:
            x, weight_kn = ge_graph.cast(x, torch.float32), ge_graph.cast(weight_kn, torch.float32)
    y = _gmm_with(ge_graph.npu_converter("npu_grouped_matmul"), x, weight_kn, group_list, group_type, request)
    return ge_graph.typed(y, dtype if out_dtype == dtype else torch.float32)


def _ge_fits(op, groups, *inner):
    if not _fits(groups, *inner):
        raise ge_graph.unsupported(op, f"{groups} groups or a dimension of {inner} beyond npu_grouped_matmul's limits")


def _psum_groups_ge(layout, alignment: int, rows):
    """GE form of ``portable.covering_psum_groups``: (cumulative ends, row mask); ``rows`` an int64 scalar tensor.
    Sizes are read from the graph (``Shape``), so symbolic token and expert counts (``dynamic=True``) stay
    symbolic."""
    ge, i64 = ge_graph.api(), torch.int64
    ends = ge_graph.cast(layout, i64)
    step = ge_graph.i64(alignment)
    aligned = ge.Mul(ge.FloorDiv(ge.Add(ends, ge_graph.i64(alignment - 1)), step), step)
    # cum[g] = aligned start of group g + 1, the last one = every row: a select, not a slice (no static count)
    g = ge_graph.arange(ge_graph.dim(layout, 0, scalar=True))
    last = ge.Sub(ge_graph.dim(layout, 0, scalar=True), ge_graph.i64(1))
    cum = ge.SelectV2(ge.Equal(g, last), rows, aligned)
    r = ge_graph.arange(rows)
    found = ge.SearchSorted(cum, r, None, dtype=ge_graph.ge_dtype(i64), right=True)
    return cum, ge.Less(r, ge.GatherV2(ends, ge.Minimum(found, last), ge_graph.i64(0)))


def _id_groups_ge(layout, groups):
    """GE form of ``portable.sorted_id_groups``: (permutation, its inverse, cumulative ends of the sorted rows);
    ``groups`` an int64 scalar tensor."""
    ge, i32, i64 = ge_graph.api(), ge_graph.ge_dtype(torch.int32), ge_graph.ge_dtype(torch.int64)
    key = ge.Maximum(ge_graph.cast(layout, torch.int32), ge.Const(0, i32))
    key_sorted, perm = ge.Sort(key, axis=-1, descending=False, stable=True)
    _, inverse = ge.Sort(perm, axis=-1, descending=False, stable=True)
    ids = ge_graph.cast(ge_graph.arange(groups), torch.int32)
    found = ge.SearchSorted(key_sorted, ids, None, dtype=i64, right=True)
    return perm, inverse, found


def _weight_kn_ge(b):
    """Our ``[G, N, K]`` weights as the ``[G, K, N]`` operand: a Transpose, as TorchAir converts ``b.transpose``."""
    return ge_graph.api().Transpose(b, ge_graph.i64([0, 2, 1]))


def _gather_rows(x, index):
    return ge_graph.api().GatherV2(x, index, ge_graph.i64(0))


@npu_ge_converter("m_grouped_bf16_gemm", ir="GroupedMatmul")
def m_grouped_bf16_gemm_ge(a, b, layout, psum, alignment, out_dtype, meta_outputs=None):
    ge, op = ge_graph.api(), "m_grouped_bf16_gemm"
    dtype, out = ge_graph.torch_dtype(a), ge_graph.torch_dtype(meta_outputs)
    _ge_fits(op, b.symsize[0], b.symsize[1], b.symsize[2])
    if psum:
        cum, valid = _psum_groups_ge(layout, alignment, ge_graph.dim(a, 0, scalar=True))
        y = _gmm_ge(op, a, _weight_kn_ge(b), cum, M_AXIS, dtype, out)
    else:
        perm, inverse, cum = _id_groups_ge(layout, ge_graph.dim(b, 0, scalar=True))
        y = _gather_rows(_gmm_ge(op, _gather_rows(a, perm), _weight_kn_ge(b), cum, M_AXIS, dtype, out), inverse)
        valid = ge.GreaterEqual(layout, ge.Const(0, layout.dtype))
    return ge_graph.cast(ge_graph.zero_rows(y, valid, 1), out)


@npu_ge_converter("m_grouped_bf16_gemm_masked", ir="GroupedMatmul")
def m_grouped_bf16_gemm_masked_ge(a, b, masked_m, out_dtype, meta_outputs=None):
    ge, op = ge_graph.api(), "m_grouped_bf16_gemm_masked"
    dtype, out = ge_graph.torch_dtype(a), ge_graph.torch_dtype(meta_outputs)
    _ge_fits(op, a.symsize[0], b.symsize[1], a.symsize[2])
    groups, m_max = ge_graph.dim(a, 0, scalar=True), ge_graph.dim(a, 1, scalar=True)
    cum = ge.Mul(ge.Add(ge_graph.arange(groups), ge_graph.i64(1)), m_max)  # every group spans m_max rows
    x = ge.Reshape(a, ge.ConcatV2([ge_graph.i64([-1]), ge_graph.dim(a, 2)], 0, N=2))
    y = _gmm_ge(op, x, _weight_kn_ge(b), cum, M_AXIS, dtype, out)
    shape = ge.ConcatV2([ge_graph.dim(a, 0), ge_graph.dim(a, 1), ge_graph.dim(b, 1)], 0, N=3)
    y = ge_graph.typed(ge.Reshape(y, shape), y._torch_dtype)
    rows = ge.Unsqueeze(ge_graph.arange(m_max), axes=[0])
    valid = ge.Less(rows, ge.Unsqueeze(ge_graph.cast(masked_m, torch.int64), axes=[1]))
    return ge_graph.cast(ge_graph.zero_rows(y, valid, 2), out)


@npu_ge_converter("k_grouped_bf16_gemm", ir="GroupedMatmul")
def k_grouped_bf16_gemm_ge(a, b, layout, num_groups, psum, alignment, c, out_dtype, meta_outputs=None):
    ge, op = ge_graph.api(), "k_grouped_bf16_gemm"
    dtype, out = ge_graph.torch_dtype(a), ge_graph.torch_dtype(meta_outputs)
    _ge_fits(op, num_groups, a.symsize[1], b.symsize[1])
    if psum:
        cum, valid = _psum_groups_ge(layout, alignment, ge_graph.dim(a, 0, scalar=True))
    else:
        perm, _, cum = _id_groups_ge(layout, ge_graph.i64(num_groups))
        a, b = _gather_rows(a, perm), _gather_rows(b, perm)
        valid = ge.GreaterEqual(_gather_rows(layout, perm), ge.Const(0, layout.dtype))
    a, b = (ge_graph.zero_rows(t, valid, 1) for t in (a, b))  # padding rows: 0 in both (0 * inf is NaN)
    x = ge.Transpose(a, ge_graph.i64([1, 0]))  # the K-grouped form's x is a.T ([M, S])
    y = _gmm_ge(op, x, b, cum, K_AXIS, dtype, torch.float32 if c is not None or out != dtype else dtype)
    if c is not None:
        y = ge_graph.typed(ge.Add(y, ge_graph.cast(c, torch.float32)), torch.float32)
    return ge_graph.cast(y, out)
