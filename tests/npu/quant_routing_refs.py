"""CPU kernels for the torch_npu ops the quant, moe_routing and fp8_gemm adapters call: OUR reading of each op's
documented semantics (torch_npu 2.13's ``_op_plugin_docs.py``; where the wheel's docs give no formula, the CANN
op README named at the function), not Ascend's kernels. Only the modes the adapters use are implemented; any
other mode raises ``NotImplementedError`` so a test cannot silently pass through an unread branch.

Outputs the docs call undefined (rows past the valid ones, ``expanded_scale`` without ``scale``) are filled with
NaN / a sentinel here, so an adapter that reads them fails the value checks.

``register()`` installs them on ``npu::<op>`` under the CPU key (once per process).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from torch_ascend_moe.testing import npu_wheel

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
EMAX = {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}  # exponent of the largest normal (docs: emax)
_MX_DST = {291: torch.float8_e5m2, 292: torch.float8_e4m3fn, 23: torch.float8_e5m2, 24: torch.float8_e4m3fn}
# An ``int?`` dtype argument reaches a kernel as its ScalarType number, whatever the caller passed.
_SCALAR_TYPES = {5: torch.float16, 6: torch.float32, 15: torch.bfloat16, 3: torch.int32}


def _biased_exponent(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    bits = v.float().contiguous().view(torch.int32)
    return (bits >> 23) & 0xFF, bits & 0x7FFFFF


def npu_dynamic_mx_quant(
    input, *, axis=-1, round_mode="rint", dst_type=296, block_size=32, scale_alg=0, dst_type_max=0.0, max_low_bound=0.0
):
    """MX quantization along the last axis to FP8 (docs "npu_dynamic_mx_quant", formulas of
    ``npu_dynamic_mx_quant_with_dual_axis`` / ``npu_grouped_dynamic_mx_quant``, which it shares):

    * scale_alg 0 (OCP MX): ``shared_exp = floor(log2(amax)) - emax``, ``mxscale = 2^shared_exp``;
      ``y = cast(V / mxscale)`` (saturating to the format's max, as OCP's conversion).
    * scale_alg 1 (cuBLAS): ``amax = max(amax, max_low_bound)``, ``S = fp32(amax / Amax(DType))``, exponent
      rounded UP (``S_ue8m0 = 2^ceil(log2 S)``), ``R = 1 / fp32(S_ue8m0)``, ``y = DType(d * R)``.

    A last group short of ``block_size`` is zero-padded. ``mxscale``: uint8 E8M0 codes, the group count padded to
    even with 0, as ``[..., ceil(groups / 2), 2]``.
    """
    if axis not in (-1, input.dim() - 1) or dst_type not in _MX_DST or round_mode != "rint":
        raise NotImplementedError("reference: FP8 along the last axis with round_mode='rint' only")
    dst = _MX_DST[dst_type]
    lead, n = input.shape[:-1], input.shape[-1]
    groups = -(-n // block_size)
    v = F.pad(input.float(), (0, groups * block_size - n)).reshape(*lead, groups, block_size)
    amax = v.abs().amax(-1)
    if scale_alg == 1:
        amax = torch.maximum(amax, torch.tensor(max_low_bound, dtype=torch.float32))
        exponent, mantissa = _biased_exponent(amax / FP8_MAX[dst])
        code = torch.where(exponent == 255, 255, exponent + (mantissa != 0).to(torch.int32)).clamp(max=255)
    elif scale_alg == 0:
        exponent, _ = _biased_exponent(amax)
        code = torch.where(exponent == 255, 255, (exponent - EMAX[dst]).clamp(min=0))
    else:
        raise NotImplementedError("reference: scale_alg 0 or 1 (FP8)")
    scale = torch.where(code == 255, float("nan"), (code.clamp(1, 254) << 23).view(torch.float32))
    scale = torch.where(code == 0, 2.0**-127, scale)
    y = (v * (1.0 / scale).unsqueeze(-1)).clamp(-FP8_MAX[dst], FP8_MAX[dst]).to(dst)
    y = y.reshape(*lead, groups * block_size)[..., :n].contiguous()
    codes = F.pad(code.to(torch.uint8), (0, groups % 2))
    return y, codes.reshape(*lead, (groups + 1) // 2, 2).contiguous()


def npu_moe_init_routing_v2(
    x,
    expert_idx,
    *,
    scale=None,
    offset=None,
    active_num=-1,
    expert_capacity=-1,
    expert_num=-1,
    drop_pad_mode=0,
    expert_tokens_num_type=0,
    expert_tokens_num_flag=False,
    quant_mode=-1,
    active_expert_range=(),
    row_idx_type=0,
    x_dtype=None,
):
    """Dropless routing without quantization (docs "npu_moe_init_routing_v2" and CANN's aclnnMoeInitRoutingV2
    formula): ``sortedExpertIdx, sortedRowIdx = keyValueSort(expertIdx, rowIdx)`` over the (token, choice) pairs
    whose expert is in ``active_expert_range`` (rowIdx = t*K + j, so equal experts keep pair order);
    ``expanded_x[i] = x[sortedRowIdx[i] // K]``; row_idx_type 0: ``expanded_row_idx[sortedRowIdx[i]] = i``, -1 for
    pairs outside the range; counts (type 1) per expert of the range, int64."""
    if drop_pad_mode != 0 or quant_mode != -1 or expert_tokens_num_type != 1 or row_idx_type != 0 or active_num > 0:
        raise NotImplementedError("reference: dropless, unquantized, count mode, gather-type row index only")
    t, k = expert_idx.shape
    if bool(((expert_idx < 0) | (expert_idx >= expert_num)).any()):
        raise ValueError("expert_idx: ids must be in [0, expert_num)")  # the docs' rule
    start, end = active_expert_range if active_expert_range else (0, expert_num)
    ids = expert_idx.long().flatten()
    valid = (ids >= start) & (ids < end)
    key = torch.where(valid, ids, end)
    order = torch.argsort(key, stable=True)
    n_valid = int(valid.sum())
    expanded_x = torch.full((t * k, x.shape[1]), float("nan"), dtype=x.dtype)
    expanded_x[:n_valid] = x[order[:n_valid] // k]
    row_idx = torch.full((t * k,), -1, dtype=torch.int32)
    row_idx[order[:n_valid]] = torch.arange(n_valid, dtype=torch.int32)
    counts = torch.bincount(ids[valid] - start, minlength=end - start).to(torch.int64)
    return expanded_x, row_idx, counts, torch.full((t * k,), float("nan"), dtype=torch.float32)


def npu_moe_gating_top_k(
    x,
    k,
    *,
    bias=None,
    input_ids=None,
    tid2eid=None,
    k_group=1,
    group_count=1,
    group_select_mode=0,
    renorm=0,
    norm_type=0,
    out_flag=False,
    routed_scaling_factor=1.0,
    eps=1e-20,
):
    """Group-limited top-k gating (docs "npu_moe_gating_top_k"; the formula from CANN's MoeGatingTopK README):
    ``normOut = sigmoid(x)`` (norm_type 1) or ``softmax(x)`` (0), in FP32; ``choice = normOut + bias``; groups of
    ``E / group_count`` scored by their max (group_select_mode 0) or the sum of their top 2 (1); the best
    ``k_group`` groups kept; ``expertIdx = TopK(choice over the kept groups, k)``; ``y = normOut[expertIdx]``
    (the scores, not the biased choice: the op's third output is normOut and DeepSeek weights are the scores);
    ``yOut = y / (sum(y) + eps) * routed_scaling_factor`` in x's dtype; ids int32; normOut FP32 ``[T, E]``.
    Ties go to the lower index (the docs say nothing on ties)."""
    if input_ids is not None or tid2eid is not None or renorm != 0:
        raise NotImplementedError("reference: no hash routing, renorm 0")
    t, e = x.shape
    scores = x.float().sigmoid() if norm_type == 1 else x.float().softmax(-1)
    choice = scores + bias.float() if bias is not None else scores
    if group_count > 1:
        grouped = choice.view(t, group_count, e // group_count)
        ranked = torch.sort(grouped, dim=-1, descending=True, stable=True).values
        group_scores = ranked[..., :2].sum(-1) if group_select_mode == 1 else ranked[..., 0]
        kept = torch.sort(group_scores, dim=-1, descending=True, stable=True).indices[:, :k_group]
        mask = torch.zeros(t, group_count, dtype=torch.bool).scatter_(1, kept, True)
        choice = choice.masked_fill(~mask.repeat_interleave(e // group_count, dim=1), float("-inf"))
    idx = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :k]
    y = scores.gather(1, idx)
    y = y / (y.sum(-1, keepdim=True) + eps) * routed_scaling_factor
    return y.to(x.dtype), idx.to(torch.int32), scores if out_flag else torch.zeros(t, e)


def npu_moe_finalize_routing(
    expanded_permuted_rows,
    skip1,
    skip2,
    bias,
    scales,
    expanded_src_to_dst_row,
    export_for_source_row,
    drop_pad_mode=0,
    k=1,
):
    """Docs "npu_moe_finalize_routing": ``out[i] = skip1[i] + skip2[i] + sum_k scales[i, k] * (rows[src_to_dst[i +
    k * num_rows]] + bias[expert[i, k]])``, dropless. Computed here in FP32, k in order from zero, rounded once to
    the rows' dtype (the docs do not say where it rounds: the adapter uses it for FP32 only)."""
    if drop_pad_mode != 0 or bias is not None or skip1 is not None or skip2 is not None:
        raise NotImplementedError("reference: dropless, no bias, no skips")
    k = scales.shape[1] if scales is not None else k
    rows = expanded_src_to_dst_row.long().view(k, -1)  # [k, num_rows]: column j of the token-major pairs
    out = torch.zeros(rows.shape[1], expanded_permuted_rows.shape[1], dtype=torch.float32)
    for j in range(k):
        term = expanded_permuted_rows[rows[j]].float()
        out = out + (term if scales is None else scales[:, j : j + 1].float() * term)
    return out.to(expanded_permuted_rows.dtype)


def npu_quant_matmul(
    x1,
    x2,
    scale,
    *,
    offset=None,
    pertoken_scale=None,
    bias=None,
    output_dtype=None,
    x1_dtype=None,
    x2_dtype=None,
    pertoken_scale_dtype=None,
    scale_dtype=None,
    group_sizes=None,
    y_scale=None,
):
    """The "G-B" FP8 mode the meta checks (``group_sizes=[1, 128, 128]``): ``x1 [M, K]`` FP8 with FP32
    ``pertoken_scale [M, K/128]``, ``x2 [K, N]`` FP8 with FP32 ``scale [K/128, N/128]``; ``out = (x1 * pts) @
    (x2 * scale)`` accumulated in FP32, rounded once to ``output_dtype``. The wheel's docs describe only the INT8 /
    INT4 modes; this reading comes from the meta's group_sizes checks (and torchao-npu's block-FP8 use)."""
    if list(group_sizes or []) != [1, 128, 128] or offset is not None or bias is not None or y_scale is not None:
        raise NotImplementedError("reference: FP8 G-B (group_sizes [1, 128, 128]) without offset/bias only")
    a = x1.float() * pertoken_scale.float().repeat_interleave(128, dim=1)[:, : x1.shape[1]]
    s = scale.float().repeat_interleave(128, dim=0)[: x2.shape[0]].repeat_interleave(128, dim=1)[:, : x2.shape[1]]
    return (a @ (x2.float() * s)).to(_SCALAR_TYPES.get(output_dtype, output_dtype))


_REFERENCES = (
    npu_dynamic_mx_quant,
    npu_moe_init_routing_v2,
    npu_moe_gating_top_k,
    npu_moe_finalize_routing,
    npu_quant_matmul,
)


@functools.cache
def register() -> None:
    """Register every reference above as the CPU kernel of its ``npu::`` op (needs ``npu_wheel.load()``)."""
    for fn in _REFERENCES:
        npu_wheel.cpu_reference(fn.__name__)(fn)
