"""Ascend adapters of the moe_routing family (torch_npu 2.13), where a torch_npu op computes exactly our op.

``moe_permute`` -> ``npu_moe_init_routing_v2`` (dropless, unquantized, ``active_expert_range=[0, E]``,
``expert_tokens_num_type=1`` counts, ``row_idx_type=0``). Its sort is ``keyValueSort(expertIdx, rowIdx)`` with
rowIdx the flat (token, choice) index, i.e. by expert then pair order, ours; its gather-type
``expanded_row_idx`` (``[T*k]``, -1 for an expert outside the range) is our ``row_map`` for ``alignment=1``.
An id of -1 (not routed) is passed as expert ``E`` (with ``expert_num=E+1``): a valid id outside the active
range, which the op documents as filtered out with -1, as ours (negative ids it does not document). The rows
past the routed ones are undefined in the op (ours are zero): they are zeroed. For ``alignment > 1`` the op's
dense segments are moved to our aligned starts on the device (segment ``e`` starts at the exclusive cumsum of
``align_up(count)``; each row moves by its segment's shift; no host sync): one extra copy of the rows, still
one sort. Portable for FP64 ``x`` (the op takes FP16/BF16/FP32), ``num_experts >= 10240`` (its limit, with the
extra id) and empty inputs.

``moe_gating_topk`` -> ``npu_moe_gating_top_k`` with ``renormalize=True``, BF16/FP16 logits cast to FP32 first
(exact: the op computes in its input's dtype and returns ``yOut`` in it; ours computes in FP32). Formula (CANN's
MoeGatingTopK; the wheel's docs list the arguments only): norm (sigmoid ``norm_type=1`` / softmax 0) in FP32, ``+
bias`` for the choice, groups scored by their max (``group_select_mode=0``, ours without a bias) or top-2 sum (1,
ours with a bias), ``k_group`` groups kept, top-k, ``yOut = y / (sum(y) + eps) * routed_scaling_factor`` with
``eps=1e-20``: ours, with the weights the unbiased scores. Not an exact match, so portable: FP64 logits,
``renormalize=False`` (the op always renormalizes), a ``topk`` above the kept groups' experts (the op requires ``k
<= E / groups * k_group``; ours then takes the best others), groups of 2 or fewer experts or more than 2048 (the
op's limits), softmax or a bias-less group score on Ascend 950 (it supports sigmoid and top-2-sum only), and empty
logits. Ids come as int32 and are widened to our int64. Ties: the docs do not say which of two equal scores wins
(ours: the lower index); with FP32 scores an exact tie needs equal logits.

``moe_unpermute`` -> ``npu_moe_finalize_routing`` for FP32 ``y`` and FP32 (or no) weights, ``y`` with exactly
``T*k`` rows and no unrouted (-1) slot: ``out[i] = sum_k scales[i, k] * y[src_to_dst[i + k*T]]``, so its
``expanded_src_to_dst_row`` is our ``row_map`` in choice-major order (``row_map.t().flatten()``). In FP32 every
product and sum of that formula is a rounding point of ours (slot by slot from zero). Portable otherwise:
BF16/FP16 (the docs do not say where the op rounds, and vllm-ascend replaced this op for accuracy; our op
accumulates in FP32 and rounds once), weights in another dtype than ``y`` (the op needs one dtype), -1 slots
(the op has no "not routed"), aligned ``y`` with padding rows (dropless indices must be in ``[0, T*k)``), and
empty inputs. ``npu_moe_token_unpermute`` is BF16 only (BF16 probs too), so it cannot take our FP32 weights.

GE graph mode (TorchAir), decided from shapes, dtypes and arguments (so at graph build; a call outside has no
graph): ``moe_gating_topk`` -> ``MoeGatingTopK`` for the calls ``gating_plan`` maps; ``moe_permute`` ->
``MoeInitRoutingV3`` (what torch_npu's converter of ``npu_moe_init_routing_v2`` builds), its aligned layout by a
gather from each output row to its dense row (TorchAir has no ``index_copy`` converter); ``moe_unpermute`` -> not
``MoeFinalizeRouting`` (its -1 slots are values, unknown when the graph is built, and the op has no "not
routed") but our portable kernel's slot-by-slot FP32 sum in GE ops (GatherV2, Mul, SelectV2, Add), bitwise ours
for every dtype but FP64 (no graph).

Every adapter validates first, as the portable kernels do (value checks included), so bad inputs raise our
errors.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import npu_ge_converter
from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.npu import ge_graph, has_op
from torch_ascend_moe.backends.npu.quant import ASCEND950, soc_version
from torch_ascend_moe.checks.moe_routing import (
    PERMUTE,
    UNPERMUTE,
    check_range,
    gating_signature,
    permute_signature,
    unpermute_signature,
)
from torch_ascend_moe.distributed import capture

_ROUTING_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_EXPERTS = 10240  # npu_moe_init_routing_v2's expert_num limit
MAX_GATING_EXPERTS = 2048  # npu_moe_gating_top_k's: E, and align32(E / groups) * groups


def _aligned_layout(counts: torch.Tensor, alignment: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(shift of each expert's rows from the dense layout to ours, our segment ends), both ``[E]`` int64."""
    dense_starts = torch.cumsum(counts, 0) - counts
    aligned = (counts + alignment - 1) // alignment * alignment
    starts = torch.cumsum(aligned, 0) - aligned
    return starts - dense_starts, starts + counts


def _init_routing(call, x, ids, num_experts: int):
    """``npu_moe_init_routing_v2`` through ``call`` (the op, or torch_npu's GE converter of it): dropless,
    unquantized, counts per expert, ids of -1 passed as the extra expert ``num_experts`` (outside the range)."""
    return call(
        x,
        ids,
        active_num=-1,
        expert_capacity=-1,
        expert_num=num_experts + 1,
        drop_pad_mode=0,
        expert_tokens_num_type=1,
        expert_tokens_num_flag=True,
        quant_mode=-1,
        active_expert_range=[0, num_experts],
        row_idx_type=0,
    )


def _takes_permute(x, topk_idx, num_experts, alignment):
    permute_signature(x, topk_idx, num_experts, alignment)
    many = num_experts >= MAX_EXPERTS
    return first_refusal(
        f"{x.dtype} rows (the routing ops take FP16/BF16/FP32)" if x.dtype not in _ROUTING_DTYPES else None,
        f"{num_experts} experts (npu_moe_init_routing_v2 takes < {MAX_EXPERTS})" if many else None,
        "empty operands: nothing to route" if topk_idx.numel() == 0 or x.shape[1] == 0 else None,
    )


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_moe_init_routing_v2",
    available=has_op("npu_moe_init_routing_v2"),
    takes=_takes_permute,
)
def moe_permute(x, topk_idx, num_experts, alignment):
    capacity = permute_signature(x, topk_idx, num_experts, alignment)
    if capture.host_readable(topk_idx):
        check_range(PERMUTE, "topk_idx", topk_idx, num_experts, "expert ids")
    t, k = topk_idx.shape
    ids = torch.where(topk_idx < 0, num_experts, topk_idx).to(torch.int32)
    expanded, row_idx, counts, _ = _init_routing(torch.ops.npu.npu_moe_init_routing_v2, x, ids, num_experts)
    shift, ends = _aligned_layout(counts, alignment)
    routed = torch.arange(t * k, device=x.device) < counts.sum()
    if alignment == 1:  # the dense layout is ours; only the undefined tail is cleared
        out = torch.where(routed.unsqueeze(1), expanded, 0)
        return out, row_idx.view(t, k), ends.to(torch.int32)
    # Dense row i belongs to the expert whose dense segment holds it; it moves by that expert's shift. Rows past
    # the routed ones go to a scratch row dropped at the end.
    expert = torch.searchsorted(torch.cumsum(counts, 0), torch.arange(t * k, device=x.device), right=True)
    dest = torch.where(
        routed, torch.arange(t * k, device=x.device) + shift[expert.clamp(max=num_experts - 1)], capacity
    )
    out = x.new_zeros(capacity + 1, x.shape[1]).index_copy_(0, dest, expanded)[:capacity]
    row_map = torch.where(row_idx >= 0, row_idx + shift[topk_idx.flatten().long().clamp(min=0)], -1)
    return out, row_map.to(torch.int32).view(t, k), ends.to(torch.int32)


def gating_refusal(logits, topk, bias, score_func, num_groups, topk_groups, renormalize) -> str | None:
    """Why ``npu_moe_gating_top_k`` does not compute a call exactly, or None when it does."""
    t, e = logits.shape
    if logits.dtype not in _ROUTING_DTYPES:
        return f"{logits.dtype} logits (the op takes FP16/BF16/FP32)"
    if not renormalize or t == 0:
        return "no renormalization, or no tokens"
    grouped = 1 < num_groups and topk_groups < num_groups
    groups, kept = (num_groups, topk_groups) if grouped else (1, 1)
    size = e // groups
    if size <= 2 or e > MAX_GATING_EXPERTS or -(-size // 32) * 32 * groups > MAX_GATING_EXPERTS:
        return f"{e} experts in {groups} groups: outside the op's limits ({MAX_GATING_EXPERTS}, groups of 3+)"
    if topk > size * kept:
        return f"top-{topk} of {kept} kept groups of {size}"
    if soc_version() >= ASCEND950 and (score_func != "sigmoid" or (grouped and bias is None)):
        return "on Ascend 950 the op takes sigmoid scores only, and a bias when grouped"
    return None


def gating_plan(logits, topk, bias, score_func, num_groups, topk_groups, renormalize) -> dict | None:
    """``npu_moe_gating_top_k``'s grouping arguments for a call it computes exactly, else None."""
    if gating_refusal(logits, topk, bias, score_func, num_groups, topk_groups, renormalize):
        return None
    grouped = 1 < num_groups and topk_groups < num_groups
    groups, kept = (num_groups, topk_groups) if grouped else (1, 1)
    return {"k_group": kept, "group_count": groups, "group_select_mode": 1 if bias is not None else 0}


def _takes_gating(logits, topk, bias, score_func, num_groups, topk_groups, renormalize, routed_scaling_factor):
    gating_signature(logits, topk, bias, score_func, num_groups, topk_groups)
    return first_refusal(gating_refusal(logits, topk, bias, score_func, num_groups, topk_groups, renormalize))


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_moe_gating_top_k",
    available=has_op("npu_moe_gating_top_k"),
    takes=_takes_gating,
)
def moe_gating_topk(logits, topk, bias, score_func, num_groups, topk_groups, renormalize, routed_scaling_factor):
    plan = gating_plan(logits, topk, bias, score_func, num_groups, topk_groups, renormalize)
    weights, idx, _ = torch.ops.npu.npu_moe_gating_top_k(
        logits.to(torch.float32),  # exact; the op computes (and returns) in its input's dtype, ours in FP32
        topk,
        bias=None if bias is None else bias.to(torch.float32),
        renorm=0,
        norm_type=1 if score_func == "sigmoid" else 0,
        out_flag=False,
        routed_scaling_factor=routed_scaling_factor,
        eps=1e-20,
        **plan,
    )
    return weights.contiguous(), idx.to(torch.int64).contiguous()


def _takes_unpermute(y, row_map, topk_weights, bias):
    unpermute_signature(y, row_map, topk_weights, bias)
    t, k = row_map.shape
    exact = y.dtype == torch.float32 and (topk_weights is None or topk_weights.dtype == torch.float32)
    why = first_refusal(
        None if exact else "not FP32 rows and weights (the op's sums round differently)",
        # A bias would be finalize_routing's skip1, but the order in which CANN adds it is not documented.
        "a bias (the order in which CANN adds it to the slots is not documented)" if bias is not None else None,
        "y is not one row per slot" if y.shape[0] != t * k else None,
        "empty operands" if row_map.numel() == 0 or y.shape[1] == 0 else None,
    )
    if not why.ok:
        return why
    # Unknown -1 slots (during a graph capture) go to the portable kernel, which handles them without a host read;
    # under fake tensors (the shape checks) the op's path is traced.
    unrouted = capture.capturing(row_map.device)
    if capture.host_readable(row_map):
        check_range(UNPERMUTE, "row_map", row_map, y.shape[0], "rows of y")
        unrouted = bool((row_map < 0).any())
    return first_refusal("unrouted (-1) slots, or unknown ones while capturing" if unrouted else None)


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_moe_finalize_routing",
    available=has_op("npu_moe_finalize_routing"),
    takes=_takes_unpermute,
)
def moe_unpermute(y, row_map, topk_weights, bias):
    k = row_map.shape[1]
    return torch.ops.npu.npu_moe_finalize_routing(
        y, None, None, None, topk_weights, row_map.t().flatten(), None, drop_pad_mode=0, k=k
    )


@npu_ge_converter("moe_gating_topk", ir="MoeGatingTopK")
def moe_gating_topk_ge(
    logits, topk, bias, score_func, num_groups, topk_groups, renormalize, routed_scaling_factor, meta_outputs=None
):
    plan = gating_plan(logits.meta, topk, bias, score_func, num_groups, topk_groups, renormalize)
    if plan is None:
        raise ge_graph.unsupported(
            "moe_gating_topk", "MoeGatingTopK does not compute this call exactly (see backends/npu/moe_routing.py)"
        )
    weights, idx, _ = ge_graph.npu_converter("npu_moe_gating_top_k")(
        ge_graph.cast(logits, torch.float32),
        topk,
        bias=None if bias is None else ge_graph.cast(bias, torch.float32),
        renorm=0,
        norm_type=1 if score_func == "sigmoid" else 0,
        out_flag=False,
        routed_scaling_factor=routed_scaling_factor,
        eps=1e-20,
        **plan,
    )
    return weights, ge_graph.cast(ge_graph.typed(idx, torch.int32), torch.int64)


def _routing_dtype_ge(op, x):
    if x.meta.dtype not in _ROUTING_DTYPES:
        raise ge_graph.unsupported(op, f"{x.meta.dtype} rows (the routing ops take FP16/BF16/FP32)")


@npu_ge_converter("moe_permute", ir="MoeInitRoutingV3")
def moe_permute_ge(x, topk_idx, num_experts, alignment, meta_outputs=None):
    _routing_dtype_ge(PERMUTE, x)
    if num_experts >= MAX_EXPERTS:
        raise ge_graph.unsupported(PERMUTE, f"{num_experts} experts (npu_moe_init_routing_v2 takes < {MAX_EXPERTS})")
    ge = ge_graph.api()
    i32, i64 = torch.int32, torch.int64
    ids = ge.SelectV2(ge.Less(topk_idx, ge.Const(0, topk_idx.dtype)), ge.Const(num_experts, topk_idx.dtype), topk_idx)
    converter = ge_graph.npu_converter("npu_moe_init_routing_v2")
    expanded, row_idx, counts, _ = _init_routing(converter, x, ge_graph.cast(ids, i32), num_experts)
    counts = ge_graph.cast(counts, i64)
    axis0 = ge_graph.i64(0)
    flat_ids = ge.Reshape(ge_graph.cast(topk_idx, i64), ge_graph.i64([-1]))
    pairs = ge_graph.dim(flat_ids, 0, scalar=True)
    routed_rows = ge_graph.arange(pairs)
    if alignment == 1:  # the dense layout is ours; only the undefined tail is cleared
        routed = ge.Less(routed_rows, ge.ReduceSum(counts, axis0, keep_dims=False))
        out = ge_graph.zero_rows(expanded, routed, 1)
        row_map = ge.Reshape(ge_graph.cast(row_idx, i32), ge.Shape(topk_idx, dtype=ge_graph.ge_dtype(i64)))
        return out, row_map, ge_graph.cast(ge.Cumsum(counts, axis0), i32)
    step = ge_graph.i64(alignment)
    aligned = ge.Mul(ge.FloorDiv(ge.Add(counts, ge_graph.i64(alignment - 1)), step), step)
    starts = ge.Cumsum(aligned, axis0, exclusive=True)
    dense_starts = ge.Cumsum(counts, axis0, exclusive=True)
    # Output row r belongs to the expert e whose aligned segment holds it; it is dense row dense_starts[e] + (r -
    # starts[e]) when that is inside e's count, else a zero row.
    rows = ge_graph.arange(ge.Add(pairs, ge_graph.i64((num_experts - 1) * (alignment - 1))))  # our capacity
    found = ge.SearchSorted(ge.Cumsum(aligned, axis0), rows, None, dtype=ge_graph.ge_dtype(i64), right=True)
    expert = ge.Minimum(found, ge_graph.i64(num_experts - 1))
    local = ge.Sub(rows, ge.GatherV2(starts, expert, axis0))
    valid = ge.Less(local, ge.GatherV2(counts, expert, axis0))
    source = ge.SelectV2(valid, ge.Add(ge.GatherV2(dense_starts, expert, axis0), local), ge_graph.i64(0))
    out = ge_graph.zero_rows(ge_graph.typed(ge.GatherV2(expanded, source, axis0), x.meta.dtype), valid, 1)
    shift = ge.Sub(starts, dense_starts)
    moved = ge.Add(ge_graph.cast(row_idx, i64), ge.GatherV2(shift, ge.Maximum(flat_ids, ge_graph.i64(0)), axis0))
    row_map = ge.SelectV2(ge.GreaterEqual(ge_graph.cast(row_idx, i64), ge_graph.i64(0)), moved, ge_graph.i64(-1))
    row_map = ge.Reshape(ge_graph.cast(row_map, i32), ge.Shape(topk_idx, dtype=ge_graph.ge_dtype(i64)))
    return out, row_map, ge_graph.cast(ge.Add(starts, counts), i32)


@npu_ge_converter("moe_unpermute", ir="GatherV2 + Add (slot order)")
def moe_unpermute_ge(y, row_map, topk_weights, bias, meta_outputs=None):
    if y.meta.dtype == torch.float64:
        raise ge_graph.unsupported(UNPERMUTE, "float64 rows")
    ge = ge_graph.api()
    slots = row_map.symsize[1]
    rows = ge_graph.cast(row_map, torch.int64)
    yf = ge_graph.cast(y, torch.float32)
    if bias is not None:
        out = ge_graph.cast(bias, torch.float32)
    else:
        out = ge.Fill(
            ge.ConcatV2([ge_graph.dim(row_map, 0), ge_graph.dim(y, 1)], 0, N=2),
            ge.Const(0.0, ge_graph.ge_dtype(torch.float32)),
        )
    for j in range(slots):  # slot by slot from zero or the bias, as the portable and C++ kernels add
        previous = out
        column = ge.Squeeze(ge.SliceD(rows, offsets=[0, j], size=[-1, 1]), axis=[1])
        term = ge.GatherV2(yf, ge.Maximum(column, ge_graph.i64(0)), ge_graph.i64(0))
        if topk_weights is not None:
            w = ge_graph.cast(ge.SliceD(topk_weights, offsets=[0, j], size=[-1, 1]), torch.float32)
            term = ge.Mul(w, term)
        routed = ge.GreaterEqual(column, ge_graph.i64(0))
        term = ge_graph.zero_rows(term, routed, 1)  # -1: nothing, NaN included
        out = ge.Add(out, term)
        if bias is not None:  # from zero a sum is never -0.0; from a -0.0 bias an unrouted slot must leave it
            out = ge.SelectV2(ge.Unsqueeze(routed, axes=[1]), out, previous)
    return ge_graph.cast(ge_graph.typed(out, torch.float32), y.meta.dtype)
