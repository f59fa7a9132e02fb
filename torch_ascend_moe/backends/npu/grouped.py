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

FP8 m-grouped GEMMs (``m_grouped_fp8_gemm``, psum and id layouts, and ``m_grouped_fp8_gemm_masked``) on Ascend 950:
``npu_grouped_matmul``'s MX form (``scale_dtype = per_token_scale_dtype = float8_e8m0fnu``: power-of-two scales per
1 x 32 block along K of both operands). DeepGEMM's scales vary along K in ``gran_k`` blocks; when every scale is a
power of two (UE8M0: ``float8_e8m0fnu`` scales, or FP32 ones that are exactly powers of two, checked on the host)
and ``gran_k`` is a multiple of 32, each of our blocks is ``gran_k / 32`` MX blocks with its scale, and B's
``gran_mn``-row blocks are that scale on each row: the same products, summed in FP32 (in the kernel's order, as
the BF16 adapters). The MX scale layouts are torchao-npu's (its MX grouped GEMM passes
``npu_dynamic_mx_quant``'s ``[M, ceil(K/64), 2]`` per-token codes and ``npu_dynamic_mx_quant_with_dual_axis``'s
``[E, ceil(K/64), N, 2]`` weight codes for a row-major ``[E, K, N]`` weight: pairs of consecutive K blocks); torch_npu
2.13's docstrings do not describe them and its Meta kernel does not check them, so the layout is our reading of
that usage (the first thing to check on hardware). The weight goes row-major ``[G, K, N]`` (a copy of our
``[G, N, K]``: the transposed-weight form's scale layout is not shown anywhere).
Portable, and why: before Ascend 950 (A2/A3 take no FP8 operands); FP4 operands (torch_npu's ``float4_e2m1fn_x2``
nibble order is not documented against DeepGEMM's); scales that are not powers of two in E8M0's range (FP32
scales in general, zero, NaN (code 255: the hardware's NaN handling is not documented)); ``gran_k`` not a multiple
of 32 or K not a multiple of 32; while capturing (the scale check reads the host). ``m_grouped_fp8_quant_gemm``
(the per-token cast inside the grouped GEMM) runs its steps through the dispatcher (``quantize_fp8``'s adapter, then
this module's ``m_grouped_fp8_gemm``: ``npu_dynamic_mx_quant`` and the MX form for UE8M0 1 x 32k casts on Ascend 950);
it has no GE converter: in a graph the MX form takes ``float8_e8m0fnu`` scale tensors, and the cast's converter
gives FP32 ones (so the compiler passes leave the cast and the GEMM apart there). ``m_grouped_fp8_linear`` has
no kernel here: its portable kernel's steps go through the dispatcher (the casts' chains, then this module's
``m_grouped_fp8_gemm``, which takes the MX form for UE8M0 casts on Ascend 950); ``k_grouped_fp8_gemm`` (weight
gradients: scale rows per group along the reduction, ``sum_g ceil(k_g / gran_k)`` of them) stays portable: MX
blocks of the K-grouped form would have to restart at each group boundary, which torchao-npu's usage pads with
zero rows (``npu_grouped_dynamic_mx_quant``), a layout our op's operands do not have.

``m_grouped_bf16_gemm_swiglu`` (the experts' L1 GEMM with its SwiGLU(-quant) epilogue) runs its portable kernel: the
grouped GEMM through this module's ``npu_grouped_matmul`` adapter, then the epilogue as elementwise ops. torch_npu's
fused ``npu_grouped_matmul_swiglu_quant`` (and its ``_v2``) takes INT8 activations and weights with per-channel
weight scales and returns INT8 with one scale per row: none of our op's forms (BF16/FP16/FP32 operands; BF16 output
or E4M3 with 1 x ``quant_gran_k`` scales) maps onto it. ``m_grouped_fp8_gemm_swiglu`` (the same with an FP8/FP4 L1)
likewise runs its portable kernel: ``m_grouped_fp8_gemm`` through the dispatcher (this module's MX adapter where it
maps), then the epilogue; the fused op's INT8 x INT8 per-channel form is not our FP8 block-scaled one.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import npu_ge_converter
from torch_ascend_moe.backends.chain import first_refusal, kernel, planned, stays_portable
from torch_ascend_moe.backends.npu import ge_graph, has_op
from torch_ascend_moe.backends.npu.quant import ASCEND950, soc_version
from torch_ascend_moe.backends.portable import grouped as portable
from torch_ascend_moe.checks.grouped import (
    K_GROUPED,
    M_GROUPED,
    M_GROUPED_FP8,
    MASKED,
    MASKED_FP8,
    k_grouped_signature,
    layout_segments,
    m_grouped_fp8_signature,
    m_grouped_signature,
    masked_fp8_signature,
    masked_rows,
    masked_signature,
)
from torch_ascend_moe.distributed.capture import host_readable

# torch_npu's group_type values.
M_AXIS, K_AXIS = 0, 2
# group_list_type: 0 = cumulative ends, 1 = per-group counts.
CUMSUM = 0
# torch_npu 2.13's documented limits (A2 docs): at most 1024 groups with a single 3-D weight, and the last
# dimension of x and weight (x: K, or M when transposed; weight: N, or K when transposed) below 65536. A call
# outside them runs the portable kernel.
MAX_GROUPS = 1024
INNER_LIMIT = 65536


def _gmm_with(call, x, weight, group_list, group_type, output_dtype, **mx):
    """``npu_grouped_matmul``'s single-tensor form through ``call``: the op itself (eager) or torch_npu's GE
    converter of it (graph mode), which take the same arguments; ``mx``: the MX scales (``_mx_args``)."""
    (y,) = call(
        [x],
        [weight],
        group_list=group_list,
        split_item=3,
        group_type=group_type,
        group_list_type=CUMSUM,
        output_dtype=output_dtype,
        **mx,
    )
    return y


def _gmm(x, weight, group_list, group_type, output_dtype=None, **mx):
    """``torch.ops.npu`` is looked up here, at call time (it exists only once torch_npu, or the test wheel's
    schemas, are loaded)."""
    return _gmm_with(torch.ops.npu.npu_grouped_matmul, x, weight, group_list, group_type, output_dtype, **mx)


def _fits(groups: int, *inner: int) -> bool:
    return groups <= MAX_GROUPS and all(d < INNER_LIMIT for d in inner)


def _limits_refusal(a, groups: int, *inner: int) -> str | None:
    """Why ``npu_grouped_matmul`` does not take BF16/FP16/FP32 operands of these sizes, or None."""
    if a.dtype == torch.float64:
        return "FP64 operands: Ascend has no FP64 matmul"
    if not _fits(groups, *inner):
        return f"{groups} groups or a dimension of {list(inner)} beyond npu_grouped_matmul's documented limits"
    return None


def _takes_m_grouped(a, b, layout, psum, alignment, out_dtype):
    m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
    return first_refusal(_limits_refusal(a, b.shape[0], b.shape[1], b.shape[2]))


def _takes_masked(a, b, masked_m, out_dtype):
    masked_signature(a, b, masked_m, out_dtype)
    return first_refusal(_limits_refusal(a, b.shape[0], b.shape[1], b.shape[2]))


def _takes_k_grouped(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype)
    return first_refusal(_limits_refusal(a, num_groups, a.shape[1], b.shape[1]))


def _weight_kn(b: torch.Tensor) -> torch.Tensor:
    """``[G, K, N]`` view of our ``[G, N, K]`` weights in a layout torch_npu takes (row-major or transposed)."""
    w = b.transpose(1, 2)
    transposed = w.stride(1) == 1 and w.stride(2) == w.shape[1]
    return w if w.is_contiguous() or transposed else w.contiguous()


def _kernel_dtype(a: torch.Tensor, dtype: torch.dtype) -> torch.dtype | None:
    """``output_dtype`` to request: none when ``dtype`` is the input's, else FP32 (rounded once afterwards)."""
    return None if dtype == a.dtype else torch.float32


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_grouped_matmul",
    available=has_op("npu_grouped_matmul"),
    takes=_takes_m_grouped,
)
def m_grouped_bf16_gemm(a, b, layout, psum, alignment, out_dtype):
    shape, dtype = m_grouped_signature(a, b, layout, psum, alignment, out_dtype)
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


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_grouped_matmul",
    available=has_op("npu_grouped_matmul"),
    takes=_takes_masked,
)
def m_grouped_bf16_gemm_masked(a, b, masked_m, out_dtype):
    shape, dtype = masked_signature(a, b, masked_m, out_dtype)
    groups, m_max, k = a.shape
    if host_readable(masked_m):
        masked_rows(MASKED, masked_m, m_max)  # our op's value errors
    if groups * m_max == 0 or k == 0 or b.shape[1] == 0:
        return torch.zeros(shape, dtype=dtype, device=a.device)
    cum = torch.arange(1, groups + 1, device=a.device) * m_max
    y = _gmm(a.reshape(groups * m_max, k).contiguous(), _weight_kn(b), cum, M_AXIS, _kernel_dtype(a, dtype))
    valid = torch.arange(m_max, device=a.device).unsqueeze(0) < masked_m.unsqueeze(1)
    return y.view(shape).masked_fill(~valid.unsqueeze(2), 0).to(dtype)


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_grouped_matmul",
    available=has_op("npu_grouped_matmul"),
    takes=_takes_k_grouped,
)
def k_grouped_bf16_gemm(a, b, layout, num_groups, psum, alignment, c, out_dtype):
    shape, dtype = k_grouped_signature(a, b, layout, num_groups, psum, alignment, c, out_dtype)
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


# ---- FP8 m-grouped GEMMs through MX (Ascend 950) ----------------------------------------------------------------

MX_BLOCK = 32  # K elements per MX scale
NPU_FLOAT8_E8M0FNU = 293  # torch_npu's dtype enum for E8M0 scales
_E8M0_ONE = 127  # the code of 1.0: what an odd count of blocks is paired with


def e8m0_codes(sf: torch.Tensor, rows: torch.Tensor | None = None, check: bool = True) -> torch.Tensor | None:
    """uint8 E8M0 codes of scales that are all powers of two in E8M0's range (2^-127 .. 2^127), or None; only the
    rows where ``rows`` (bool ``[sf.size(0)]``) is set count (the others' codes are 1.0: rows no group owns, whose
    results are zeroed). The check reads the values on the host; ``check=False`` (E8M0 tensors only, while
    capturing) skips it: a NaN code (255) then reaches the kernel as it is."""
    if sf.dtype == torch.float8_e8m0fnu:
        codes = sf.view(torch.uint8)
        ok = codes != 255  # 255 is NaN
    else:
        bits = sf.contiguous().view(torch.int32)
        exponent = (bits >> 23) & 0xFF
        tiny = bits == 0x00400000  # 2^-127, FP32's subnormal, E8M0's code 0
        ok = ((bits >= 0) & ((bits & 0x7FFFFF) == 0) & (exponent >= 1) & (exponent <= 254)) | tiny
        codes = torch.where(tiny, 0, exponent).to(torch.uint8)
    if rows is not None:
        keep = rows.view(-1, *([1] * (sf.dim() - 1)))
        ok, codes = ok | ~keep, torch.where(keep, codes, _E8M0_ONE)
    return codes if not check or bool(ok.all()) else None


def mx_pairs(codes: torch.Tensor) -> torch.Tensor:
    """``[..., B]`` codes (one per 32-wide K block) as ``[..., ceil(B/2), 2]`` consecutive pairs (an odd count
    padded with 1.0)."""
    if codes.shape[-1] % 2:
        codes = torch.cat([codes, codes.new_full((*codes.shape[:-1], 1), _E8M0_ONE)], -1)
    return codes.reshape(*codes.shape[:-1], codes.shape[-1] // 2, 2).contiguous()


def _mx_refusal(a, b, recipe_a, recipe_b, dtype) -> str | None:
    """Why MX does not take these dtypes and shapes (no values read, no SoC asked), or None."""
    k = a.shape[-1]
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        return "not FP8 x FP8"
    if recipe_a[1] % MX_BLOCK or recipe_b[1] % MX_BLOCK or k % MX_BLOCK or k == 0:
        return f"K or gran_k not a multiple of the MX block ({MX_BLOCK})"
    if dtype not in (torch.bfloat16, torch.float32):
        return f"{dtype} output"
    return None


def _mx_fits(a, b, recipe_a, recipe_b, dtype) -> bool:
    """The conditions on dtypes and shapes MX has (no values read, no SoC asked)."""
    return _mx_refusal(a, b, recipe_a, recipe_b, dtype) is None


def _mx_call_refusal(a, b, recipe_a, recipe_b, dtype, readable: bool, e8m0: bool) -> str | None:
    """Why the MX form does not take a call before its values are read, or None."""
    why = _mx_refusal(a, b, recipe_a, recipe_b, dtype)
    if why is None and soc_version() < ASCEND950:
        why = "not an Ascend 950 (no FP8 before it)"
    if why is None and not (readable or e8m0):
        why = "FP32 scales while capturing: their powers of two cannot be checked on the host"
    return why


def _e8m0_scales(sfa, sfb) -> bool:
    """E8M0 scale tensors: powers of two by their dtype, so MX takes them with no host check (while capturing)."""
    return sfa.dtype == sfb.dtype == torch.float8_e8m0fnu


def _mx_args(a2, sfa2, b, sfb, recipe_a, recipe_b, rows, check=True):
    """(x, weight [G, K, N], MX kwargs) for ``npu_grouped_matmul``, or None when a scale of a row some group owns
    (``rows``), or of B, is not a power of two in E8M0's range. ``a2``/``sfa2`` are 2-D (rows, K)."""
    codes_a, codes_b = e8m0_codes(sfa2, rows, check), e8m0_codes(sfb, None, check)
    if codes_a is None or codes_b is None:
        return None
    k, n = a2.shape[1], b.shape[1]
    blocks = k // MX_BLOCK
    per_token = codes_a.repeat_interleave(recipe_a[1] // MX_BLOCK, 1)[:, :blocks]
    weight = codes_b.repeat_interleave(recipe_b[0], 1)[:, :n].repeat_interleave(recipe_b[1] // MX_BLOCK, 2)
    weight = mx_pairs(weight[:, :, :blocks]).permute(0, 2, 1, 3).contiguous()  # [G, ceil(K/64), N, 2]
    mx = {
        "scale": [weight],
        "per_token_scale": [mx_pairs(per_token)],
        "scale_dtype": NPU_FLOAT8_E8M0FNU,
        "per_token_scale_dtype": NPU_FLOAT8_E8M0FNU,
    }
    return a2.contiguous(), b.transpose(1, 2).contiguous(), mx


def _m_grouped_mx_plan(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    """(x, w, MX kwargs, cumulative ends, owned rows, row permutation or None) of a call the MX form computes, or
    why not (a str). Our layout errors first; FP32 scales are checked to be powers of two on the host."""
    _, dtype = m_grouped_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)
    rows, groups = a.shape[0], b.shape[0]
    readable = host_readable(layout)
    why = _mx_call_refusal(a, b, recipe_a, recipe_b, dtype, readable, _e8m0_scales(sfa, sfb))
    if why:
        return why
    if readable:
        layout_segments(M_GROUPED_FP8, layout, psum, alignment, rows, groups)  # our op's value errors
    if rows == 0 or groups == 0 or b.shape[1] == 0 or not _fits(groups, b.shape[1], a.shape[1]):
        return "empty operands, or sizes beyond npu_grouped_matmul's limits"
    perm = None
    if psum:
        cum, valid = portable.covering_psum_groups(layout, alignment, rows)
    else:
        perm, cum, _ = portable.sorted_id_groups(layout, groups)
        valid = layout >= 0
    operands = _mx_args(a, sfa, b, sfb, recipe_a, recipe_b, valid, check=readable)
    if operands is None:
        return "a scale that is not a power of two in E8M0's range (MX scales are UE8M0)"
    return (*operands, cum, valid, perm)


_M_GROUPED_MX = planned(_m_grouped_mx_plan)


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_grouped_matmul (MX)",
    available=has_op("npu_grouped_matmul"),
    takes=_M_GROUPED_MX,
)
def m_grouped_fp8_gemm(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype):
    _, dtype = m_grouped_fp8_signature(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype)
    x, w, mx, cum, valid, perm = _M_GROUPED_MX.result(
        a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype
    )
    if psum:
        y = _gmm(x, w, cum, M_AXIS, dtype, **mx)
    else:
        mx["per_token_scale"] = [mx["per_token_scale"][0].index_select(0, perm)]
        y_sorted = _gmm(x.index_select(0, perm), w, cum, M_AXIS, dtype, **mx)
        y = torch.empty_like(y_sorted).index_copy_(0, perm, y_sorted)
    return y.masked_fill(~valid.unsqueeze(1), 0)


def _masked_mx_plan(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
    """(x, w, MX kwargs, owned rows) of a masked call the MX form computes, or why not (a str)."""
    _, dtype = masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
    groups, m_max, k = a.shape
    readable = host_readable(masked_m)
    why = _mx_call_refusal(a, b, recipe_a, recipe_b, dtype, readable, _e8m0_scales(sfa, sfb))
    if why:
        return why
    if readable:
        masked_rows(MASKED_FP8, masked_m, m_max)  # our op's value errors
    if groups * m_max == 0 or b.shape[1] == 0 or not _fits(groups, b.shape[1], k):
        return "empty operands, or sizes beyond npu_grouped_matmul's limits"
    valid = torch.arange(m_max, device=a.device).unsqueeze(0) < masked_m.unsqueeze(1)
    a2, sfa2 = a.reshape(groups * m_max, k), sfa.reshape(groups * m_max, -1)
    operands = _mx_args(a2, sfa2, b, sfb, recipe_a, recipe_b, valid.reshape(-1), check=readable)
    if operands is None:
        return "a scale that is not a power of two in E8M0's range (MX scales are UE8M0)"
    return (*operands, valid)


_MASKED_MX = planned(_masked_mx_plan)


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_grouped_matmul (MX)",
    available=has_op("npu_grouped_matmul"),
    takes=_MASKED_MX,
)
def m_grouped_fp8_gemm_masked(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype):
    shape, dtype = masked_fp8_signature(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
    groups, m_max, _ = a.shape
    x, w, mx, valid = _MASKED_MX.result(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype)
    cum = torch.arange(1, groups + 1, device=a.device) * m_max
    y = _gmm(x, w, cum, M_AXIS, dtype, **mx)
    return y.view(shape).masked_fill(~valid.unsqueeze(2), 0)


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


def _mx_codes_ge(sf, rows_expand: int, blocks_per_scale: int, rows, blocks, batched: bool):
    """GE form of the E8M0 code expansion: ``float8_e8m0fnu`` scales ``[(G,) R', B']`` bitcast to uint8 codes and
    gathered to ``[(G,) rows, blocks]`` (row ``r`` takes scale row ``r // rows_expand``, K block ``j`` scale column
    ``j // blocks_per_scale``), then paired along K as ``mx_pairs`` does. ``rows``/``blocks`` are int64 scalar
    tensors (symbolic sizes stay symbolic)."""
    ge, dt = ge_graph.api(), ge_graph.dtypes()
    codes = ge.Bitcast(sf, type=dt.DT_UINT8)
    axis = 1 if batched else 0
    if rows_expand > 1:
        index = ge.FloorDiv(ge_graph.arange(rows), ge_graph.i64(rows_expand))
        codes = ge.GatherV2(codes, index, ge_graph.i64(axis))
    index = ge.FloorDiv(ge_graph.arange(blocks), ge_graph.i64(blocks_per_scale))
    codes = ge.GatherV2(codes, index, ge_graph.i64(axis + 1))
    lead = [ge_graph.dim(codes, d) for d in range(axis + 1)]
    # One 1.0 column after the blocks, then the first 2 * ceil(blocks / 2) columns: an odd count's pair is padded.
    pad = ge.Fill(ge.ConcatV2([*lead, ge_graph.i64([1])], 0, N=axis + 2), ge.Const(_E8M0_ONE, dt.DT_UINT8))
    codes = ge.ConcatV2([codes, pad], axis + 1, N=2)
    pairs = ge.FloorDiv(ge.Add(blocks, ge_graph.i64(1)), ge_graph.i64(2))
    even = ge.Reshape(ge.Mul(pairs, ge_graph.i64(2)), ge_graph.i64([1]))
    keep = ge.ConcatV2([ge_graph.i64([-1] * (axis + 1)), even], 0, N=2)
    codes = ge.Slice(codes, ge_graph.i64([0] * (axis + 2)), keep)
    shape = ge.ConcatV2([*lead, ge.Reshape(pairs, ge_graph.i64([1])), ge_graph.i64([2])], 0, N=axis + 3)
    return ge.Reshape(codes, shape)


def _mx_ge(op, a, sfa, b, sfb, recipe_a, recipe_b, out_dtype, metas):
    """(x, weight [G, K, N], MX kwargs) in GE ops, or a clear error where the graph cannot take the call: E8M0
    scale tensors only (FP32 ones would need the host's power-of-two check). ``metas``: the fake tensors
    ``(a [rows, K], sfa, b, sfb)`` stand for; K may be symbolic (a multiple of 32 is then a guard of the trace)."""
    a_meta, sfa_meta, b_meta, sfb_meta = metas
    if not ge_graph.is_ascend950():
        raise ge_graph.unsupported(op, "FP8 grouped GEMMs map onto npu_grouped_matmul's MX form on Ascend 950 only")
    if not _mx_fits(a_meta, b_meta, recipe_a, recipe_b, out_dtype):
        raise ge_graph.unsupported(op, "MX takes FP8 E4M3 operands, gran_k and K multiples of 32, BF16/FP32 outputs")
    if sfa_meta.dtype != torch.float8_e8m0fnu or sfb_meta.dtype != torch.float8_e8m0fnu:
        raise ge_graph.unsupported(op, "in a graph MX takes float8_e8m0fnu scales (FP32 ones need a host check)")
    ge = ge_graph.api()
    blocks = ge.FloorDiv(ge_graph.dim(a, 1, scalar=True), ge_graph.i64(MX_BLOCK))
    per_token = _mx_codes_ge(sfa, 1, recipe_a[1] // MX_BLOCK, None, blocks, False)  # [rows, P, 2]
    n = ge_graph.dim(b, 1, scalar=True)
    weight_codes = _mx_codes_ge(sfb, recipe_b[0], recipe_b[1] // MX_BLOCK, n, blocks, True)  # [G, N, P, 2]
    mx = {
        "scale": [ge.Transpose(weight_codes, ge_graph.i64([0, 2, 1, 3]))],  # [G, P, N, 2]
        "per_token_scale": [per_token],
        "scale_dtype": NPU_FLOAT8_E8M0FNU,
        "per_token_scale_dtype": NPU_FLOAT8_E8M0FNU,
    }
    return ge_graph.typed(a, torch.float8_e4m3fn), ge_graph.typed(_weight_kn_ge(b), torch.float8_e4m3fn), mx


_OUT_ENUM = {torch.bfloat16: 15, torch.float32: 6}  # ScalarType numbers, as torch_npu's converter compares them


def _mx_gmm_ge(x, w, cum, mx, out_dtype):
    y = _gmm_with(ge_graph.npu_converter("npu_grouped_matmul"), x, w, cum, M_AXIS, _OUT_ENUM[out_dtype], **mx)
    return ge_graph.typed(y, out_dtype)


@npu_ge_converter("m_grouped_fp8_gemm", ir="GroupedMatmul (MX)")
def m_grouped_fp8_gemm_ge(a, sfa, b, sfb, layout, psum, alignment, recipe_a, recipe_b, out_dtype, meta_outputs=None):
    ge, op = ge_graph.api(), "m_grouped_fp8_gemm"
    out = ge_graph.torch_dtype(meta_outputs)
    _ge_fits(op, b.symsize[0], b.symsize[1], a.symsize[1])
    x, w, mx = _mx_ge(op, a, sfa, b, sfb, recipe_a, recipe_b, out, (a.meta, sfa.meta, b.meta, sfb.meta))
    if psum:
        cum, valid = _psum_groups_ge(layout, alignment, ge_graph.dim(a, 0, scalar=True))
        y = _mx_gmm_ge(x, w, cum, mx, out)
    else:
        perm, inverse, cum = _id_groups_ge(layout, ge_graph.dim(b, 0, scalar=True))
        mx["per_token_scale"] = [_gather_rows(mx["per_token_scale"][0], perm)]
        x = ge_graph.typed(_gather_rows(x, perm), torch.float8_e4m3fn)
        y = _gather_rows(_mx_gmm_ge(x, w, cum, mx, out), inverse)
        valid = ge.GreaterEqual(layout, ge.Const(0, layout.dtype))
    return ge_graph.typed(ge_graph.zero_rows(y, valid, 1), out)


@npu_ge_converter("m_grouped_fp8_gemm_masked", ir="GroupedMatmul (MX)")
def m_grouped_fp8_gemm_masked_ge(a, sfa, b, sfb, masked_m, recipe_a, recipe_b, out_dtype, meta_outputs=None):
    ge, op = ge_graph.api(), "m_grouped_fp8_gemm_masked"
    out = ge_graph.torch_dtype(meta_outputs)
    _ge_fits(op, a.symsize[0], b.symsize[1], a.symsize[2])
    groups, m_max = ge_graph.dim(a, 0, scalar=True), ge_graph.dim(a, 1, scalar=True)
    flat = ge.Reshape(a, ge.ConcatV2([ge_graph.i64([-1]), ge_graph.dim(a, 2)], 0, N=2))
    flat_sf = ge.Reshape(sfa, ge.ConcatV2([ge_graph.i64([-1]), ge_graph.dim(sfa, 2)], 0, N=2))
    metas = (a.meta.flatten(0, 1), sfa.meta.flatten(0, 1), b.meta, sfb.meta)
    x, w, mx = _mx_ge(op, flat, flat_sf, b, sfb, recipe_a, recipe_b, out, metas)
    cum = ge.Mul(ge.Add(ge_graph.arange(groups), ge_graph.i64(1)), m_max)
    y = _mx_gmm_ge(x, w, cum, mx, out)
    shape = ge.ConcatV2([ge_graph.dim(a, 0), ge_graph.dim(a, 1), ge_graph.dim(b, 1)], 0, N=3)
    y = ge_graph.typed(ge.Reshape(y, shape), out)
    rows = ge.Unsqueeze(ge_graph.arange(m_max), axes=[0])
    valid = ge.Less(rows, ge.Unsqueeze(ge_graph.cast(masked_m, torch.int64), axes=[1]))
    return ge_graph.typed(ge_graph.zero_rows(y, valid, 2), out)


stays_portable(
    "m_grouped_fp8_linear",
    "m_grouped_fp8_quant_gemm",
    device="npu",
    why="no kernel of its own: its portable steps (the casts, m_grouped_fp8_gemm) reach their own Ascend chains",
)
stays_portable(
    "k_grouped_fp8_gemm",
    device="npu",
    why="per-group scale rows along the reduction have no MX / npu_grouped_matmul form",
)
stays_portable(
    "m_grouped_bf16_gemm_swiglu",
    "m_grouped_fp8_gemm_swiglu",
    device="npu",
    why=(
        "npu_grouped_matmul_swiglu_quant is INT8 with per-channel scales: no dtype, scale layout or rounding "
        "point in common; the grouped GEMM inside still maps"
    ),
)
