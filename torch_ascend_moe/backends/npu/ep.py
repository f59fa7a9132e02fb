"""The ep family on Ascend: torch_npu's MC2 ops (``npu_moe_distribute_dispatch_v2`` / ``combine_v2``) where
their semantics map onto ours (specs/deepep_api.md §10, specs/npu_triton_facts.md §2).

What maps, and what stays on the portable kernels (``all_to_all_single`` over HCCL):

* ``dispatch_expand`` / ``combine_expanded`` (functions, not registered on an op): MC2 dispatch natively
  produces the EXPANDED layout, one row per (token, expert) grouped by local expert (DeepEP V2's
  ``do_expand`` = our ``ep_expand`` of a dispatch's rows, with ``expert_alignment=1``), with a static capacity
  ``A = global_bs * min(L, K)`` rows; MC2 combine is WEIGHTED (``sum_k w[t, k] * y_k(t)``, DeepEP LL's
  combine). So the exact pair is "dispatch + ep_expand" fused, and "weighted un-expand + combine" fused:
  what a compiler pass (or ``nn.MoE``) can call in place of ``ep_dispatch`` -> ``ep_expand`` -> GEMMs ->
  ``ep_reduce_slots(weights)`` -> ``ep_combine`` on an NPU. Rows past ``counts.sum()`` are unspecified (MC2
  does not zero them; ``ep_expand`` does).
* ``ep_dispatch`` (compact or static ``num_worst_tokens``), ``ep_dispatch_cached``, ``ep_combine``: portable.
  They move one row per (token, destination RANK) and combine UNWEIGHTED; MC2 moves one row per (token,
  EXPERT) and combines weighted. The two coincide only when every rank owns one expert (E == R), and even
  then our schema's handle (``send_src``, ``send_counts``, ``recv_counts``, ``recv_gather``) must be real
  tensors that ``ep_combine``, ``ep_dispatch_cached`` and the autograd backward consume, while MC2's routing
  state (``assist_info_for_combine``, ``ep_recv_counts``) is opaque: no exact adapter.
* ``ep_low_latency_dispatch``: ``npu_moe_distribute_dispatch_v2`` (the adapter below), exactly, without relying
  on MC2's row order or opaque state: each (token, slot) carries its source code ``rank * T + t`` as its
  ``expert_scales`` value (an FP32 integer, exact below 2^24), which MC2 returns per received row as
  ``expand_scales``; the rows are then sorted by (local expert, source rank, token) on the device, which is our
  layout, and ``src_info`` / ``layout_range`` / ``recv_count`` are computed from the codes. Conditions (the
  same on every rank, so every rank takes the same path): BF16/FP16 rows without ``use_fp8`` (MC2 quantizes to
  int8, DeepEP to E4M3) or ``slot_weights``, ``K <= 16``, ``H`` within MC2's range, every rank with the same
  ``T <= 512`` (MC2's ``global_bs = 0`` form; read from the header all ranks exchange anyway), not capturing
  (no header then). Otherwise the portable transport, after the same checks.
* ``ep_low_latency_combine``: portable: ``combine_v2`` needs MC2's opaque ``assist_info_for_combine``, which our
  handle does not carry (ours works from ``src_info``). The data part maps: MC2's rows inside
  an expert are source-rank-major, then ascending token (CANN's MoeDistributeDispatch design note for A2,
  ``ops-transformer/mc2/moe_distribute_dispatch_v2/docs``: ``ep_recv_counts`` = inclusive sums over (local
  expert, source rank), a token's slot in its expert's segment = how many earlier tokens of that source chose
  the expert), i.e. ``recv_x[e, :recv_count[e]]`` packed back to back, and ``expert_token_nums`` =
  ``recv_count`` (both checked on one rank). The handle does not: ``src_info [L, R*T_max]`` (source token of
  each row) is not an MC2 output, and the aclnn docs say ``assist_info_for_combine`` / ``ep_recv_counts`` /
  ``tp_recv_counts`` / ``expand_scales`` values differ by product, algorithm and version: "pass them to
  combine, do not depend on them". So ``combine_v2`` cannot run from our handle, nor ours from MC2's.
  Registering the pair needs a handle that carries MC2's state (a schema change: the dispatch returning an
  opaque state tensor, the combine taking it; ``src_info`` unspecified on Ascend). FP8 (``use_fp8``) does not
  map either: MC2 quantizes to int8 per token (``quant_mode=2``), DeepEP to E4M3 per 128 channels.
* ``ep_expand`` / ``ep_dispatch_layout``: local, portable (``npu_moe_init_routing_v2`` is the local analogue;
  its order is the same expert-major stable order, but it has no alignment padding; not wired here).

Limits MC2 puts on the mapping (CANN's aclnnMoeDistributeDispatchV2 docs; the torch_npu 2.13 wheel's docstrings
have no entry for the MC2 ops; deepep_api.md §10.1): bf16/fp16 ``x``, ``K <= 16``,
``H`` in [1024, 8192] (A3), ``BS <= 512``, ``ep_world_size >= 2`` on hardware (the CPU reference here runs
one rank), empty slots (-1) only through the 2-D ``x_active_mask`` (A3), ``HCCL_BUFFSIZE`` sized for ``A``
rows, and a dedicated EP communicator; when ranks' ``BS`` differ (``global_bs``) every token must be active,
so no empty slots either. Nothing here has run on Ascend hardware: the checks are torch_npu's
own schemas and Meta kernels under FakeTensorMode, and values against a one-rank CPU reference of the MC2
ops written from their documented semantics (tests/npu/ep_mqa_hc_refs.py).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from torch_ascend_moe._registry import npu_ge_converter, npu_kernel
from torch_ascend_moe.backends.npu import ge_graph
from torch_ascend_moe.backends.portable import ep as portable
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.distributed.exchange import place_rows
from torch_ascend_moe.distributed.groups import resolve_group

OP = "ascend_moe.backends.npu.ep"


def hccl_comm_name(group_name: str) -> str:
    """The HCCL communicator name of the process group ``group_name`` (what MC2's ``group_ep`` takes), as
    vllm-ascend obtains it: ``group._get_backend(npu).get_hccl_comm_name(rank in the group)``. Needs
    torch_npu and an HCCL group; tests monkeypatch this function."""
    group = resolve_group(OP, group_name)
    # PrivateUse1's name: "npu" once torch_npu has renamed it (vllm-ascend passes torch.device("npu")).
    backend = group._get_backend(torch.device(torch._C._get_privateuse1_backend_name()))
    return backend.get_hccl_comm_name(group.rank())


@torch._dynamo.assume_constant_result
def _group_info(group_name: str) -> tuple[int, int, str]:
    """(world size, rank, HCCL communicator name) of ``group_name``: constants of a compiled graph (dynamo
    calls this while tracing instead of tracing the process-group lookup)."""
    group = resolve_group(OP, group_name)
    return group.size(), group.rank(), hccl_comm_name(group_name)


class MC2Handle(NamedTuple):
    """What ``combine_expanded`` replays: MC2's opaque routing state plus the dispatch's routing."""

    expert_ids: torch.Tensor  # [BS, K] int32 (empty slots: an unused expert of the row, masked out)
    expert_scales: torch.Tensor  # [BS, K] float32: the routing weights combine applies
    active_mask: torch.Tensor | None  # [BS, K] bool (2-D x_active_mask), None when every slot is valid
    assist_info: torch.Tensor  # MC2's assist_info_for_combine (opaque)
    ep_recv_counts: torch.Tensor  # MC2's ep_recv_counts (combine's ep_send_counts)
    tp_recv_counts: torch.Tensor
    group_name: str
    num_experts: int
    global_bs: int  # MC2's global_bs: 0 = every rank has this rank's BS, else R * T_max


class MC2Expanded(NamedTuple):
    x: torch.Tensor  # [A, H] expert-major rows; rows past counts.sum() unspecified
    counts: torch.Tensor  # [L] int32 rows per local expert (ep_expand's counts)
    psum: torch.Tensor  # [L] int32 inclusive prefix sums (ep_expand's psum with expert_alignment=1)
    handle: MC2Handle


def _fill_empty_slots(idx: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``idx`` with each -1 slot replaced by an expert its row does not use (the smallest ones, in slot order),
    so rows stay duplicate-free as MC2 requires even for masked slots; no host sync."""
    t, k = idx.shape
    empty = idx < 0
    used = torch.zeros(t, num_experts + 1, dtype=torch.int8, device=idx.device)
    used.scatter_(1, torch.where(empty, num_experts, idx), 1)
    free = torch.sort(used[:, :num_experts], dim=1, stable=True).indices[:, :k]  # unused experts first
    nth = (torch.cumsum(empty.long(), 1) - 1).clamp(min=0)
    return torch.where(empty, free.gather(1, nth), idx)


def _routing(topk_idx: torch.Tensor, topk_weights: torch.Tensor | None, num_experts: int, mask_empty_slots: bool):
    idx = topk_idx.long()
    active = idx >= 0 if mask_empty_slots else None
    expert_ids = (_fill_empty_slots(idx, num_experts) if mask_empty_slots else idx).to(torch.int32)
    if topk_weights is None:
        weights = torch.ones(idx.shape, dtype=torch.float32, device=idx.device)
    else:
        weights = topk_weights.to(torch.float32)
    if active is not None:
        weights = torch.where(active, weights, 0)
    return expert_ids, weights, active


def dispatch_expand(
    x: torch.Tensor,
    topk_idx: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
    *,
    num_experts: int,
    group_name: str,
    num_max_tokens_per_rank: int = 0,
    mask_empty_slots: bool = True,
) -> MC2Expanded:
    """``ep_dispatch`` then ``ep_expand(expert_alignment=1, num_rows=A)`` in one MC2 dispatch: this rank's
    experts' rows, expert-major, ``A = R * T_max * min(L, K)`` rows (``T_max = num_max_tokens_per_rank`` or
    this rank's ``T``, which every rank must then share). ``topk_weights`` travel in the handle (MC2 applies
    them in combine). ``mask_empty_slots`` passes ``topk_idx >= 0`` as the 2-D ``x_active_mask`` (A3); with
    ``False`` every id must be a valid expert, distinct per row (A2; also required with
    ``num_max_tokens_per_rank`` when ranks' T differ: MC2 then wants every token active)."""
    r, rank, name = _group_info(group_name)
    global_bs = r * num_max_tokens_per_rank if num_max_tokens_per_rank > 0 else 0
    expert_ids, weights, active = _routing(topk_idx, topk_weights, num_experts, mask_empty_slots)
    expand_x, _, assist_info, token_nums, ep_recv_counts, tp_recv_counts, _ = (
        torch.ops.npu.npu_moe_distribute_dispatch_v2.default(
            x,
            expert_ids,
            name,
            r,
            rank,
            num_experts,
            x_active_mask=active,
            shared_expert_num=0,  # no shared-expert ranks (A2 wants 0; A3 takes 0 or 1)
            quant_mode=0,
            global_bs=global_bs,
            expert_token_nums_type=1,  # counts
        )
    )
    counts = token_nums.to(torch.int32)
    handle = MC2Handle(
        expert_ids,
        weights,
        active,
        assist_info,
        ep_recv_counts,
        tp_recv_counts,
        group_name,
        num_experts,
        global_bs,
    )
    return MC2Expanded(expand_x, counts, torch.cumsum(counts, 0, dtype=torch.int32), handle)


def combine_expanded(y: torch.Tensor, handle: MC2Handle) -> torch.Tensor:
    """``combined[t] = sum_k w[t, k] * y[row(t, k)]`` back on the source ranks (MC2 combine: weighted, as
    ``ep_low_latency_combine`` / ``ep_reduce_slots(weights=...)`` + ``ep_combine``): ``[T, H]`` in ``y``'s dtype.
    ``y`` is the expert outputs in ``dispatch_expand``'s layout (``[A, H]``)."""
    r, rank, name = _group_info(handle.group_name)
    return torch.ops.npu.npu_moe_distribute_combine_v2.default(
        y,
        handle.expert_ids,
        handle.assist_info,
        handle.ep_recv_counts,
        handle.expert_scales,
        name,
        r,
        rank,
        handle.num_experts,
        tp_send_counts=handle.tp_recv_counts,
        x_active_mask=handle.active_mask,
        shared_expert_num=0,
        global_bs=handle.global_bs,
    )


# MC2's documented limits (A3) on the low-latency form: hidden size, top-k, tokens per rank (BS).
MC2_HIDDEN = (1024, 8192)
MC2_MAX_TOPK = 16
MC2_MAX_TOKENS = 512
_MC2_DTYPES = (torch.bfloat16, torch.float16)


def ll_layout_from_mc2(expand_x, token_nums, expand_scales, tokens: int, t_max: int, ranks: int):
    """Our low-latency layout ``(recv_x [L, R*T_max, H], recv_count [L], src_info [L, R*T_max],
    layout_range [L, R])`` from MC2 dispatch outputs, whatever MC2's row order inside an expert: ``expand_x``'s
    rows are grouped by local expert (``token_nums`` rows each, the rest unspecified), ``expand_scales[row]`` is
    the row's source code ``source rank * tokens + token``. No host sync."""
    local, n, device = token_nums.shape[0], ranks * t_max, expand_x.device
    counts = token_nums.long()
    ends = torch.cumsum(counts, 0)
    rows = torch.arange(expand_x.shape[0], device=device)
    valid = rows < ends[-1]
    expert = torch.searchsorted(ends, rows, right=True).clamp(max=local - 1)
    code = expand_scales.round().long().clamp(min=0)
    source, token = code // tokens, code % tokens
    # (local expert, source rank, token): our order; rows past the valid ones sort last.
    key = torch.where(valid, (expert * ranks + source) * t_max + token, local * n)
    order = torch.sort(key, stable=True).indices
    valid, expert, source, token = (v.index_select(0, order) for v in (valid, expert, source, token))
    position = torch.arange(order.shape[0], device=device) - (ends - counts).index_select(0, expert)
    dest = torch.where(valid, expert * n + position, -1)
    recv_x = place_rows(expand_x.index_select(0, order), dest, local * n).view(local, n, expand_x.shape[1])
    src_info = torch.full((local * n + 1,), -1, dtype=torch.int32, device=device)
    src_info.index_copy_(0, torch.where(valid, dest, local * n), torch.where(valid, token, -1).int())
    per_source = torch.zeros(local * ranks + 1, dtype=torch.int64, device=device)
    per_source.index_add_(0, torch.where(valid, expert * ranks + source, local * ranks), torch.ones_like(source))
    per_source = per_source[:-1].view(local, ranks)
    begins = torch.cumsum(per_source, 1) - per_source
    return recv_x, counts.int(), src_info[:-1].view(local, n), (begins << 32) | per_source


def _mc2_static(args) -> bool:
    """The conditions every rank shares (the header makes them agree): dtype, FP8, slot weights, K, H."""
    h, k = args.x.shape[1], args.topk_idx.shape[1]
    fits = MC2_HIDDEN[0] <= h <= MC2_HIDDEN[1] and k <= MC2_MAX_TOPK
    return args.x.dtype in _MC2_DTYPES and not args.use_fp8 and args.slot_weights is None and fits


def _ll_dispatch_v2(call, x, expert_ids, active, code, name: str, ranks: int, rank: int, num_experts: int):
    """``npu_moe_distribute_dispatch_v2`` through ``call`` (the op, or torch_npu's GE converter of it) in the
    low-latency form: no shared experts, unquantized, counts per expert, every rank with the same T
    (``global_bs=0``), each slot's source code as its ``expert_scales``."""
    return call(
        x,
        expert_ids,
        name,
        ranks,
        rank,
        num_experts,
        x_active_mask=active,
        expert_scales=code,
        shared_expert_num=0,
        quant_mode=0,
        global_bs=0,
        expert_token_nums_type=1,
    )


@npu_kernel(calls="npu_moe_distribute_dispatch_v2")
def ep_low_latency_dispatch(args):
    mc2 = _mc2_static(args) and not capture.capturing(args.x.device)
    t, k = args.topk_idx.shape
    group, r, idx, tokens = portable.ll_dispatch_checks(
        args, torch.tensor([t], dtype=torch.int64, device=args.x.device) if mc2 else None
    )
    if mc2 and tokens is not None:  # None on fake tensors (shape checks): no header was exchanged
        every = tokens[:, 0].tolist()  # each rank's T, from the header every rank exchanged
        mc2 = len(set(every)) == 1 and 0 < t <= MC2_MAX_TOKENS
    if not mc2:
        return portable.ll_transport(args, group, r, idx)
    ranks, rank, name = _group_info(args.group_name)
    expert_ids, _, active = _routing(idx, None, args.num_experts, True)
    code = (rank * t + torch.arange(t, device=args.x.device)).float().unsqueeze(1).expand(t, k).contiguous()
    call = torch.ops.npu.npu_moe_distribute_dispatch_v2.default
    outs = _ll_dispatch_v2(call, args.x, expert_ids, active, code, name, ranks, rank, args.num_experts)
    expand_x, token_nums, expand_scales = outs[0], outs[3], outs[6]
    recv_x, count, src_info, layout_range = ll_layout_from_mc2(
        expand_x, token_nums, expand_scales, t, args.num_max_dispatch_tokens_per_rank, ranks
    )
    return recv_x, args.x.new_empty(*recv_x.shape[:2], 0, dtype=portable._ABSENT), count, src_info, layout_range


# ---- TorchAir GE converter ------------------------------------------------------------------------------------


def _fill_empty_slots_ge(idx, num_experts: int):
    """GE form of ``_fill_empty_slots``: each -1 slot takes the n-th smallest expert its row does not use (n = its
    rank among the row's empty slots), by one-hot comparisons ([T, K, E] booleans; K, E small)."""
    ge, i64 = ge_graph.api(), torch.int64
    ids = ge_graph.cast(idx, i64)
    empty = ge.Less(ids, ge_graph.i64(0))
    experts = ge_graph.arange(num_experts)
    used = ge.ReduceAny(ge.Equal(ge.Unsqueeze(ids, axes=[2]), experts), ge_graph.i64([1]), keep_dims=False)
    free = ge.LogicalNot(used)  # [T, E]
    free_rank = ge.Sub(ge.Cumsum(ge_graph.cast(free, i64), ge_graph.i64(1)), ge_graph.i64(1))
    nth = ge.Maximum(ge.Sub(ge.Cumsum(ge_graph.cast(empty, i64), ge_graph.i64(1)), ge_graph.i64(1)), ge_graph.i64(0))
    pick = ge.LogicalAnd(
        ge.Unsqueeze(free, axes=[1]), ge.Equal(ge.Unsqueeze(free_rank, axes=[1]), ge.Unsqueeze(nth, axes=[2]))
    )  # [T, K, E]: the expert each slot would take
    chosen = ge.ArgMaxV2(ge_graph.cast(pick, torch.int32), ge_graph.i64(2), dtype=ge_graph.ge_dtype(i64))
    return ge_graph.cast(ge.SelectV2(empty, chosen, ids), torch.int32), ge.LogicalNot(empty)


def _ll_layout_from_mc2_ge(expand_x, token_nums, expand_scales, tokens, t_max: int, ranks: int, local: int):
    """GE form of ``ll_layout_from_mc2`` (``tokens`` an int64 scalar tensor): the rows sorted by (expert, source,
    token), each output slot gathering its row (no scatter: TorchAir has no index_copy converter)."""
    ge, i64 = ge_graph.api(), torch.int64
    n = ranks * t_max
    zero = ge_graph.i64(0)
    counts = ge_graph.cast(token_nums, i64)
    ends = ge.Cumsum(counts, zero)
    starts = ge.Sub(ends, counts)
    rows = ge_graph.arange(ge_graph.dim(expand_x, 0, scalar=True))
    valid = ge.Less(rows, ge.GatherV2(ends, ge_graph.i64(local - 1), zero))
    found = ge.SearchSorted(ends, rows, None, dtype=ge_graph.ge_dtype(i64), right=True)
    expert = ge.Minimum(found, ge_graph.i64(local - 1))
    code = ge_graph.cast(ge.Round(expand_scales), i64)
    source = ge.FloorDiv(code, tokens)
    token = ge.Sub(code, ge.Mul(source, tokens))
    key = ge.Add(ge.Mul(ge.Add(ge.Mul(expert, ge_graph.i64(ranks)), source), ge_graph.i64(t_max)), token)
    key = ge.SelectV2(valid, key, ge_graph.i64(local * n))
    sorted_key, order = ge.Sort(key, axis=-1, descending=False, stable=True)
    # Output slot (e, j) takes sorted row starts[e] + j when j < counts[e].
    j = ge.Unsqueeze(ge_graph.arange(n), axes=[0])  # [1, n]
    slot_valid = ge.Less(j, ge.Unsqueeze(counts, axes=[1]))  # [L, n]
    last = ge.Sub(ge_graph.dim(expand_x, 0, scalar=True), ge_graph.i64(1))
    position = ge.Minimum(ge.Add(ge.Unsqueeze(starts, axes=[1]), j), last)
    row = ge.GatherV2(order, ge.Reshape(position, ge_graph.i64([-1])), zero)  # [L * n]
    recv_x = ge.GatherV2(expand_x, row, zero)
    recv_x = ge_graph.zero_rows(recv_x, ge.Reshape(slot_valid, ge_graph.i64([-1])), 1)
    recv_x = ge.Reshape(recv_x, ge.ConcatV2([ge_graph.i64([local, n]), ge_graph.dim(expand_x, 1)], 0, N=2))
    src_info = ge.SelectV2(
        slot_valid, ge.Reshape(ge.GatherV2(token, row, zero), ge_graph.i64([local, n])), ge_graph.i64(-1)
    )
    # Rows of (e, source) have keys in [(e*R + source) * T_max, (e*R + source + 1) * T_max) among the sorted ones.
    bounds = ge.Mul(ge_graph.arange(local * ranks + 1), ge_graph.i64(t_max))
    at = ge.SearchSorted(sorted_key, bounds, None, dtype=ge_graph.ge_dtype(i64), right=False)
    per_source = ge.Sub(
        ge.SliceD(at, offsets=[1], size=[local * ranks]), ge.SliceD(at, offsets=[0], size=[local * ranks])
    )
    per_source = ge.Reshape(per_source, ge_graph.i64([local, ranks]))
    begins = ge.Cumsum(per_source, ge_graph.i64(1), exclusive=True)
    layout_range = ge.Add(ge.Mul(begins, ge_graph.i64(1 << 32)), per_source)
    return recv_x, ge_graph.cast(counts, torch.int32), ge_graph.cast(src_info, torch.int32), layout_range


@npu_ge_converter("ep_low_latency_dispatch", ir="MoeDistributeDispatchV2")
def ep_low_latency_dispatch_ge(
    x,
    topk_idx,
    num_max_dispatch_tokens_per_rank,
    num_experts,
    group_name,
    use_fp8,
    round_scale,
    use_ue8m0,
    slot_weights,
    timeout_s,
    meta_outputs=None,
):
    import types

    meta = types.SimpleNamespace(x=x.meta, topk_idx=topk_idx.meta, use_fp8=use_fp8, slot_weights=slot_weights)
    if not _mc2_static(meta):
        raise ge_graph.unsupported(
            "ep_low_latency_dispatch",
            f"MC2 takes BF16/FP16 rows without use_fp8 or slot_weights, K <= 16 and H in {list(MC2_HIDDEN)}",
        )
    # A graph has no header exchange: every rank is taken to run the same graph, with the same T (MC2's
    # global_bs = 0 form), and ids are not validated (as while capturing).
    ge = ge_graph.api()
    ranks, rank, name = _group_info(group_name)
    local, t_max = num_experts // ranks, num_max_dispatch_tokens_per_rank
    tokens = ge_graph.dim(topk_idx, 0, scalar=True)
    expert_ids, active = _fill_empty_slots_ge(topk_idx, num_experts)
    code = ge.Add(ge.Mul(ge_graph.i64(rank), tokens), ge_graph.arange(tokens))  # rank * T + t
    code = ge_graph.cast(
        ge.Add(ge.Unsqueeze(code, axes=[1]), ge.ZerosLike(ge_graph.cast(topk_idx, torch.int64))), torch.float32
    )
    converter = ge_graph.npu_converter("npu_moe_distribute_dispatch_v2")
    outs = _ll_dispatch_v2(converter, x, expert_ids, active, code, name, ranks, rank, num_experts)
    recv_x, count, src_info, layout_range = _ll_layout_from_mc2_ge(
        outs.expand_x, outs.expert_token_nums, outs.expand_scales, tokens, t_max, ranks, local
    )
    scales = ge.Fill(ge_graph.i64([local, ranks * t_max, 0]), ge.Const(0, ge_graph.ge_dtype(portable._ABSENT)))
    return recv_x, scales, count, src_info, layout_range


__all__ = [
    "MC2Expanded",
    "MC2Handle",
    "combine_expanded",
    "dispatch_expand",
    "ep_low_latency_dispatch",
    "hccl_comm_name",
    "ll_layout_from_mc2",
]
