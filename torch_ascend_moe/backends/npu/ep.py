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
  does not zero them; ``ep_expand`` does). DeepEP V2's expand mode (``ElasticBuffer.dispatch(do_expand=True)``,
  our ``ep_dispatch`` + ``ep_expand``) is not routed here: its rows are in V2's order (source rank, then token,
  aligned per expert), its ``EPHandle`` carries the rank-level dispatch's routing (``recv_src_idx``, rank prefix
  sums, per-rank weights) that cached dispatch, combine and the autograd backward consume, and its combine
  rounds per-rank partials (V2's reduction recipe) where MC2's combine sums every slot in one step; MC2 gives
  neither the handle nor those rounding points. What V2's expanded layout is, MC2 computes through
  ``ep_low_latency_dispatch`` / ``_combine`` (below), whose semantics (per-(token, expert) rows, a weighted
  combine with one rounding) are MC2's.
* ``ep_dispatch`` (compact or static ``num_worst_tokens``), ``ep_dispatch_cached``, ``ep_combine``: portable.
  They move one row per (token, destination RANK) and combine UNWEIGHTED; MC2 moves one row per (token,
  EXPERT) and combines weighted. The two coincide only when every rank owns one expert (E == R), and even
  then our schema's handle (``send_src``, ``send_counts``, ``recv_counts``, ``recv_gather``) must be real
  tensors that ``ep_combine``, ``ep_dispatch_cached`` and the autograd backward consume, while MC2's routing
  state (``assist_info_for_combine``, ``ep_recv_counts``) is opaque: no exact adapter.
* ``ep_low_latency_dispatch`` / ``ep_low_latency_combine``: ``npu_moe_distribute_dispatch_v2`` /
  ``combine_v2``, exactly in the dispatch's layout, without relying on MC2's row order or on the values of its
  opaque outputs. Each token's row carries its source code ``rank * T + t`` in ``CODE_COLUMNS`` extra columns
  (its bytes as exact small integers; MC2 moves unquantized rows as they are), so every received row says where
  it came from; the rows are sorted by (local expert, source rank, token) on the device, which is our layout,
  and ``src_info`` / ``layout_range`` / ``recv_count`` come from the codes. (``expert_scales`` cannot carry the
  codes: A3 does not take them and on A2 they are the weights combine applies.) The dispatch returns MC2's
  ``assist_info_for_combine`` and ``ep_recv_counts`` with the map from MC2's rows to ours as its
  ``backend_state``; the combine gathers the expert outputs back into MC2's rows with it and calls
  ``combine_v2`` with the routing weights, which weights and sums the slots (its summation order and precision
  are CANN's, not documented: the result is the weighted sum, not bitwise our slot-order FP32 sum).
  Conditions, the same on every rank (the dispatch's header makes them agree, and the combine's exchanges
  whether every rank has a state): Atlas A2 or A3 (Ascend 950 has no MC2 V2 ops), BF16/FP16 rows without
  ``use_fp8`` (MC2 quantizes to int8, DeepEP to E4M3) or ``slot_weights``, ``K <= 16``, ``H + CODE_COLUMNS``
  within the product's range, every rank with the same ``T`` up to the product's ``Bs`` limit (MC2's
  ``global_bs = 0`` form), on A2 no empty (-1) slot on any rank (A2 masks whole tokens only), not capturing (no
  header then). Otherwise the portable transport after the same checks, with an empty ``backend_state``; a
  combine without a state (or with a re-packed handle) is the portable one, so the pair is exact either way.
* ``ep_expand`` / ``ep_dispatch_layout``: local, portable (``npu_moe_init_routing_v2`` is the local analogue;
  its order is the same expert-major stable order, but it has no alignment padding; not wired here).

Limits MC2 puts on the mapping (CANN's aclnnMoeDistributeDispatchV2 / CombineV2 docs, ops-transformer's
``mc2/``; the torch_npu 2.13 wheel's docstrings have no entry for the MC2 ops; deepep_api.md §10.1): Atlas A2
and A3 only; bf16/fp16 ``x``; ``K <= 16``; ``H`` in [1024, 8192] on A3, up to 7168 (a multiple of 32) on A2;
``Bs <= 512`` (A3) / 256 (A2); ``ep_world_size`` in [2, 768] (A3) / 16..256 (A2) on hardware (the CPU
reference here runs one rank); empty slots only through A3's 2-D ``x_active_mask``; ``expert_scales`` in
dispatch only on A2; ``HCCL_BUFFSIZE`` sized for ``A`` rows; a dedicated EP communicator; when ranks' ``Bs``
differ (``global_bs``) every token must be active. Nothing here has run on Ascend hardware: the checks are
torch_npu's own schemas and Meta kernels under FakeTensorMode, and values against CPU references of the MC2
ops written from their documented semantics (tests/npu/ep_mqa_hc_refs.py), one rank end to end and several
ranks simulated.

CANN's v3 ops (``npu_moe_distribute_dispatch_v3`` / ``combine_v3`` with a context tensor and ``ccl_buffer_size``,
MX ``quant_mode=4``, zero/copy/const experts; ``MoeDistributeBuffer``; specs/upstream_2609.md §10) and the A3
``npu_moe_distribute_{dispatch,combine}_{setup,teardown}`` split are not mapped: the pinned torch_npu 2.13.0 wheel
ships none of them (its YAML schemas and Meta registrations name only the v1/v2 distribute ops and
``combine_add_rms_norm``; the v3 ops live in the separate ``npu_ops_transformer`` package, whose repository the
index does not name and whose schemas we could not check against a Meta kernel as the v2 adapters are). When a
torch_npu release ships them, the v2 adapters' scheme (source codes in extra columns, our layout rebuilt on the
device) carries over with the context tensor in place of the group name.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe._registry import npu_ge_converter, result_type
from torch_ascend_moe.backends.chain import first_refusal, kernel, stays_portable
from torch_ascend_moe.backends.npu import ge_graph, has_op
from torch_ascend_moe.backends.npu.quant import soc_version
from torch_ascend_moe.backends.portable.ep.low_latency import (
    ll_combine_checks,
    ll_combine_transport,
    ll_dispatch_checks,
    ll_transport,
)
from torch_ascend_moe.checks.ep import ABSENT
from torch_ascend_moe.distributed import capture, payload
from torch_ascend_moe.distributed.groups import resolve_group
from torch_ascend_moe.distributed.payload import place_rows

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
        x_active_mask=handle.active_mask,
        shared_expert_num=0,
        global_bs=handle.global_bs,
    )


# ---- low-latency dispatch / combine through MC2 ------------------------------------------------------------------

# SoC numbers (torch_npu's SocVersion): Atlas A2 = Ascend910B1..B4_1, A3 = Ascend910_93xx; Ascend 950 (260) has no
# MC2 dispatch/combine V2 (aclnnMoeDistributeDispatchV2's product table).
A2_SOCS = range(220, 226)
A3_SOCS = range(250, 256)
# MC2's documented limits per product: hidden size (our rows carry CODE_COLUMNS more), tokens per rank (Bs).
MC2_HIDDEN = {"A3": (1024, 8192), "A2": (32, 7168)}
MC2_MAX_TOKENS = {"A3": 512, "A2": 256}
MC2_MAX_TOPK = 16
_MC2_DTYPES = (torch.bfloat16, torch.float16)
# Each row's source code (rank * T + t) rides in the row itself, as CODE_COLUMNS extra columns of which the first
# three hold its bytes as exact small integers (0..255: exact in BF16 and FP16, never NaN or subnormal, so a byte
# copy and a value copy keep them alike). 32 columns keep A2's "H a multiple of 32". Codes are < 2^24 because
# R * T <= 768 * 512.
CODE_COLUMNS = 32
_CODE_BYTES = 3


def mc2_product() -> str | None:
    """ "A3", "A2" or None (no MC2 V2 ops: Ascend 950, other SoCs) for this process's NPU."""
    soc = soc_version()
    return "A3" if soc in A3_SOCS else "A2" if soc in A2_SOCS else None


def with_codes(x: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """``x [T, H]`` with ``CODE_COLUMNS`` columns appended holding ``codes [T]`` (int64, < 2^24) byte by byte."""
    shifts = torch.arange(_CODE_BYTES, device=x.device) * 8
    digits = (codes.unsqueeze(1) >> shifts) & 0xFF
    pad = torch.zeros(x.shape[0], CODE_COLUMNS - _CODE_BYTES, dtype=x.dtype, device=x.device)
    return torch.cat([x, digits.to(x.dtype), pad], dim=1)


def codes_of(rows: torch.Tensor) -> torch.Tensor:
    """int64 codes carried by ``rows [A, H + CODE_COLUMNS]`` (``with_codes``'s inverse)."""
    h = rows.shape[1] - CODE_COLUMNS
    digits = rows[:, h : h + _CODE_BYTES].float().round().long()
    return (digits << (torch.arange(_CODE_BYTES, device=rows.device) * 8)).sum(1)


def ll_layout_from_mc2(expand_x, token_nums, tokens: int, t_max: int, ranks: int):
    """Our low-latency layout ``(recv_x [L, R*T_max, H], recv_count [L], src_info [L, R*T_max], layout_range
    [L, R], row_map [A])`` from MC2 dispatch outputs, whatever MC2's row order inside an expert: ``expand_x``'s
    rows (``[A, H + CODE_COLUMNS]``, each with its source code ``source rank * tokens + token``) are grouped by
    local expert (``token_nums`` rows each, the rest unspecified). ``row_map[i]`` is the flat ``[L * R*T_max]``
    row of ours that MC2's row ``i`` became (-1: none), which the combine inverts. No host sync."""
    local, n, device = token_nums.shape[0], ranks * t_max, expand_x.device
    h = expand_x.shape[1] - CODE_COLUMNS
    counts = token_nums.long()
    ends = torch.cumsum(counts, 0)
    rows = torch.arange(expand_x.shape[0], device=device)
    valid = rows < ends[-1]
    expert = torch.searchsorted(ends, rows, right=True).clamp(max=local - 1)
    code = codes_of(expand_x)
    source, token = code // tokens, code % tokens
    # (local expert, source rank, token): our order; rows past the valid ones sort last.
    key = torch.where(valid, (expert * ranks + source) * t_max + token, local * n)
    order = torch.sort(key, stable=True).indices
    valid, expert, source, token = (v.index_select(0, order) for v in (valid, expert, source, token))
    position = torch.arange(order.shape[0], device=device) - (ends - counts).index_select(0, expert)
    dest = torch.where(valid, expert * n + position, -1)
    recv_x = place_rows(expand_x[:, :h].index_select(0, order), dest, local * n).view(local, n, h)
    src_info = torch.full((local * n + 1,), -1, dtype=torch.int32, device=device)
    src_info.index_copy_(0, torch.where(valid, dest, local * n), torch.where(valid, token, -1).int())
    per_source = torch.zeros(local * ranks + 1, dtype=torch.int64, device=device)
    per_source.index_add_(0, torch.where(valid, expert * ranks + source, local * ranks), torch.ones_like(source))
    per_source = per_source[:-1].view(local, ranks)
    begins = torch.cumsum(per_source, 1) - per_source
    row_map = torch.empty_like(dest).index_copy_(0, order, dest).int()
    return recv_x, counts.int(), src_info[:-1].view(local, n), (begins << 32) | per_source, row_map


def mc2_state(row_map, ep_recv_counts, assist_info) -> torch.Tensor:
    """The dispatch's ``backend_state``: int32 ``[3 + A + n_ep + n_assist]`` = ``(A, n_ep, n_assist)``, the row map,
    MC2's ``ep_recv_counts`` and ``assist_info_for_combine`` (opaque; passed back to combine_v2 untouched)."""
    sizes = torch.tensor([row_map.numel(), ep_recv_counts.numel(), assist_info.numel()], dtype=torch.int32)
    return torch.cat([sizes.to(row_map.device), row_map.int(), ep_recv_counts.int(), assist_info.int()])


def split_state(state: torch.Tensor, where: str):
    """``(row_map, ep_recv_counts, assist_info)`` of a ``backend_state`` (reads its 3 sizes on the host)."""
    sizes = state[:3].tolist() if state.numel() >= 3 else []
    if len(sizes) != 3 or min(sizes) < 0 or 3 + sum(sizes) != state.numel():
        expected = "the state ep_low_latency_dispatch returned (3 sizes, then that many int32 entries)"
        got = f"{state.numel()} entries starting {sizes}"
        raise ValueError(ck.message(where, "backend_state", "value", expected, got))
    a, n_ep, _ = sizes
    return state[3 : 3 + a], state[3 + a : 3 + a + n_ep], state[3 + a + n_ep :]


def _ll_mc2_product(args, h: int) -> str | None:
    """The product whose MC2 takes this call (the conditions every rank shares: dtype, FP8, slot weights, K, H),
    or None."""
    product = mc2_product()
    if product is None:
        return None
    low, high = MC2_HIDDEN[product]
    k = args.topk_idx.shape[1]
    fits = low <= h + CODE_COLUMNS <= high and k <= MC2_MAX_TOPK
    ok = args.x.dtype in _MC2_DTYPES and not args.use_fp8 and args.slot_weights is None and fits
    return product if ok else None


def _ll_dispatch_v2(call, x, expert_ids, active, name: str, ranks: int, rank: int, num_experts: int):
    """``npu_moe_distribute_dispatch_v2`` through ``call`` (the op, or torch_npu's GE converter of it) in the
    low-latency form: no shared experts, unquantized, counts per expert, every rank with the same T
    (``global_bs=0``), no ``expert_scales`` (A3 does not take them; on A2 they change what combine expects)."""
    return call(
        x,
        expert_ids,
        name,
        ranks,
        rank,
        num_experts,
        x_active_mask=active,
        shared_expert_num=0,
        quant_mode=0,
        global_bs=0,
        expert_token_nums_type=1,
    )


_NO_MC2 = (
    "not an MC2 call: Atlas A2/A3, BF16/FP16 rows without use_fp8 or slot_weights, K <= 16, H in the product's "
    "range, not capturing"
)


def _takes_ll_dispatch(args):
    local = not capture.capturing(args.x.device) and _ll_mc2_product(args, args.x.shape[1]) is not None
    return first_refusal(None if local else _NO_MC2)


def _takes_ll_combine(args):
    local = capture.host_readable(args.topk_idx) and args.x.dtype in _MC2_DTYPES and mc2_product() is not None
    return first_refusal(None if local else _NO_MC2)


# What every rank shares decides locally (``takes``); what differs between ranks (T, empty slots, whether each
# holds an MC2 state) is agreed on in the header the ops exchange anyway, so these two kernels still run the
# portable transport when another rank cannot take MC2: a choice no rank can make alone.
@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_moe_distribute_dispatch_v2",
    available=has_op("npu_moe_distribute_dispatch_v2"),
    takes=_takes_ll_dispatch,
)
def ep_low_latency_dispatch(args):
    t = args.topk_idx.shape[0]
    product = _ll_mc2_product(args, args.x.shape[1])
    # Every rank's T and whether it has empty (-1) slots ride in the header the checks exchange anyway (none on
    # fake tensors: their shapes go through torch_npu's meta of the MC2 call).
    extra = None
    if product is not None and capture.host_readable(args.topk_idx):
        extra = torch.tensor([t, int((args.topk_idx < 0).any())], dtype=torch.int64, device=args.x.device)
    group, r, idx, gathered = ll_dispatch_checks(args, extra)
    if product is not None and gathered is not None:
        tokens, empty = gathered[:, 0].tolist(), gathered[:, 1].tolist()
        # MC2 wants one T on every rank (global_bs = 0 form); A2 masks tokens, not slots (a 1-D active mask).
        same_t = len(set(tokens)) == 1 and 0 < t <= MC2_MAX_TOKENS[product]
        product = product if same_t and (product == "A3" or not any(empty)) else None
    if product is None:
        return ll_transport(args, group, r, idx)
    ranks, rank, name = _group_info(args.group_name)
    expert_ids, _, active = _routing(idx, None, args.num_experts, product == "A3")
    codes = rank * t + torch.arange(t, device=args.x.device)
    call = torch.ops.npu.npu_moe_distribute_dispatch_v2.default
    outs = _ll_dispatch_v2(call, with_codes(args.x, codes), expert_ids, active, name, ranks, rank, args.num_experts)
    expand_x, assist_info, token_nums, ep_recv_counts = outs[0], outs[2], outs[3], outs[4]
    recv_x, count, src_info, layout_range, row_map = ll_layout_from_mc2(
        expand_x, token_nums, t, args.num_max_dispatch_tokens_per_rank, ranks
    )
    scales = args.x.new_empty(*recv_x.shape[:2], 0, dtype=ABSENT)
    return result_type("ep_low_latency_dispatch")(
        recv_x=recv_x,
        recv_x_scales=scales,
        recv_count=count,
        src_info=src_info,
        layout_range=layout_range,
        backend_state=mc2_state(row_map, ep_recv_counts, assist_info),
    )


def _ll_combine_v2(call, y, expert_ids, assist_info, ep_send_counts, weights, active, name, ranks, rank, experts):
    """``npu_moe_distribute_combine_v2`` through ``call`` with the parameters ``_ll_dispatch_v2`` used (no TP: no
    ``tp_send_counts``; no ``expand_scales``)."""
    return call(
        y,
        expert_ids,
        assist_info,
        ep_send_counts,
        weights,
        name,
        ranks,
        rank,
        experts,
        x_active_mask=active,
        shared_expert_num=0,
        global_bs=0,
    )


# A template: the header exchange fills in {ranks}.
_BAD_STATE = ck.message(
    "ascend_moe::ep_low_latency_combine",
    "backend_state",
    "value",
    "the state ep_low_latency_dispatch returned (3 sizes, then that many int32 entries, rows inside x)",
    "another tensor on rank(s) {ranks}",
)


def _state_pieces(state, rows: int):
    """``split_state`` of a state that must index ``rows`` rows of ours, or None when it is not one."""
    try:
        row_map, ep_recv_counts, assist_info = split_state(state, "ascend_moe::ep_low_latency_combine")
    except ValueError:
        return None
    if row_map.numel() and int(row_map.max()) >= rows:
        return None
    return row_map, ep_recv_counts, assist_info


@kernel(
    device="npu",
    library="torch_npu",
    calls="npu_moe_distribute_combine_v2",
    available=has_op("npu_moe_distribute_combine_v2"),
    takes=_takes_ll_combine,
)
def ep_low_latency_combine(args):
    local, n, h = args.x.shape
    state = args.backend_state
    has_state = state is not None and state.numel() > 0
    pieces = _state_pieces(state, local * n) if has_state else None
    product = mc2_product()
    empty = int((args.topk_idx < 0).any())
    extra = torch.tensor([int(has_state and product is not None), empty], dtype=torch.int64, device=args.x.device)
    # A bad state on one rank fails every rank (the others would wait in MC2's collective).
    errors = {"backend_state": (has_state and pieces is None, _BAD_STATE)}
    group, r, gathered = ll_combine_checks(args, extra, errors)
    ready, empties = gathered[:, 0].tolist(), gathered[:, 1].tolist()
    if not (all(ready) and (product == "A3" or not any(empties))):
        return ll_combine_transport(args, group, r)
    row_map, ep_recv_counts, assist_info = pieces
    ranks, rank, name = _group_info(args.group_name)
    expert_ids, weights, active = _routing(args.topk_idx, args.topk_weights, r * local, product == "A3")
    # MC2's rows from ours: row i of the dispatch's expand_x became our row row_map[i] (-1: none), and had the
    # dispatch's width (the code columns: zeros here).
    y = payload.take_rows(args.x.reshape(local * n, h), row_map.long(), True)
    y = torch.cat([y, y.new_zeros(y.shape[0], CODE_COLUMNS)], dim=1)
    call = torch.ops.npu.npu_moe_distribute_combine_v2.default
    out = _ll_combine_v2(
        call, y, expert_ids, assist_info, ep_recv_counts, weights, active, name, ranks, rank, r * local
    )
    return out[:, :h].contiguous()


# ---- TorchAir GE converters ------------------------------------------------------------------------------------


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


def _with_codes_ge(x, codes, dtype: torch.dtype):
    """GE form of ``with_codes`` (``codes`` int64 ``[T]``)."""
    ge = ge_graph.api()
    shifts = ge.Mul(ge_graph.arange(_CODE_BYTES), ge_graph.i64(8))
    digits = ge.BitwiseAnd(ge.RightShift(ge.Unsqueeze(codes, axes=[1]), shifts), ge_graph.i64(0xFF))
    pad = ge.Fill(
        ge.ConcatV2([ge_graph.dim(x, 0), ge_graph.i64([CODE_COLUMNS - _CODE_BYTES])], ge_graph.i64(0), N=2),
        ge.Const(0, ge_graph.ge_dtype(dtype)),
    )
    return ge_graph.typed(ge.ConcatV2([x, ge_graph.cast(digits, dtype), pad], ge_graph.i64(1), N=3), dtype)


def _codes_of_ge(rows):
    """GE form of ``codes_of``."""
    ge, i64 = ge_graph.api(), torch.int64
    first = ge.Sub(ge_graph.dim(rows, 1, scalar=True), ge_graph.i64(CODE_COLUMNS))
    digits = ge.GatherV2(rows, ge.Add(first, ge_graph.arange(_CODE_BYTES)), ge_graph.i64(1))
    digits = ge_graph.cast(ge.Round(ge_graph.cast(digits, torch.float32)), i64)
    shifts = ge.Mul(ge_graph.arange(_CODE_BYTES), ge_graph.i64(8))
    return ge.ReduceSum(ge.LeftShift(digits, shifts), ge_graph.i64([1]), keep_dims=False)


def _ll_layout_from_mc2_ge(expand_x, token_nums, tokens, t_max: int, ranks: int, local: int):
    """GE form of ``ll_layout_from_mc2`` (``tokens`` an int64 scalar tensor): the rows sorted by (expert, source,
    token), each output slot gathering its row (no scatter: TorchAir has no index_copy converter); the row map by
    inverting the sort."""
    ge, i64 = ge_graph.api(), torch.int64
    n = ranks * t_max
    zero = ge_graph.i64(0)
    h = ge.Sub(ge_graph.dim(expand_x, 1), ge_graph.i64([CODE_COLUMNS]))
    data = ge.Slice(expand_x, ge_graph.i64([0, 0]), ge.ConcatV2([ge_graph.i64([-1]), h], zero, N=2))
    counts = ge_graph.cast(token_nums, i64)
    ends = ge.Cumsum(counts, zero)
    starts = ge.Sub(ends, counts)
    rows = ge_graph.arange(ge_graph.dim(expand_x, 0, scalar=True))
    valid = ge.Less(rows, ge.GatherV2(ends, ge_graph.i64(local - 1), zero))
    found = ge.SearchSorted(ends, rows, None, dtype=ge_graph.ge_dtype(i64), right=True)
    expert = ge.Minimum(found, ge_graph.i64(local - 1))
    code = _codes_of_ge(expand_x)
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
    recv_x = ge.GatherV2(data, row, zero)
    recv_x = ge_graph.zero_rows(recv_x, ge.Reshape(slot_valid, ge_graph.i64([-1])), 1)
    recv_x = ge.Reshape(recv_x, ge.ConcatV2([ge_graph.i64([local, n]), h], 0, N=2))
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
    # Sorted position p holds row order[p], which became our row expert[p] * n + (p - starts[expert[p]]).
    p = ge_graph.arange(ge_graph.dim(expand_x, 0, scalar=True))
    sorted_expert = ge.GatherV2(expert, order, zero)
    dest = ge.Add(ge.Mul(sorted_expert, ge_graph.i64(n)), ge.Sub(p, ge.GatherV2(starts, sorted_expert, zero)))
    dest = ge.SelectV2(ge.GatherV2(valid, order, zero), dest, ge_graph.i64(-1))
    row_map = ge.GatherV2(dest, ge.InvertPermutation(ge_graph.cast(order, i64)), zero)
    cast = ge_graph.cast
    return recv_x, cast(counts, torch.int32), cast(src_info, torch.int32), layout_range, cast(row_map, torch.int32)


def _mc2_state_ge(row_map, ep_recv_counts, assist_info):
    """GE form of ``mc2_state``."""
    ge, i32 = ge_graph.api(), torch.int32
    pieces = [ge_graph.cast(t, i32) for t in (row_map, ep_recv_counts, assist_info)]
    sizes = ge_graph.cast(ge.ConcatV2([ge_graph.dim(t, 0) for t in pieces], ge_graph.i64(0), N=3), i32)
    return ge_graph.typed(ge.ConcatV2([sizes, *pieces], ge_graph.i64(0), N=4), i32)


def _split_state_ge(state):
    """GE form of ``split_state`` (sizes read in the graph; no validation: a graph cannot raise on values)."""
    ge, i64 = ge_graph.api(), torch.int64
    sizes = ge_graph.cast(ge.SliceD(state, offsets=[0], size=[3]), i64)
    a, n_ep = ge.SliceD(sizes, offsets=[0], size=[1]), ge.SliceD(sizes, offsets=[1], size=[1])
    first = ge_graph.i64([3])
    row_map = ge.Slice(state, first, a)
    ep = ge.Slice(state, ge.Add(first, a), n_ep)
    assist = ge.Slice(state, ge.Add(ge.Add(first, a), n_ep), ge_graph.i64([-1]))
    return (ge_graph.typed(t, torch.int32) for t in (row_map, ep, assist))


def _ge_product(op: str, x_dtype: torch.dtype) -> None:
    """A GE graph has no header exchange and no fallback: MC2 on A3 (slots masked by its 2-D mask) or nothing."""
    if mc2_product() != "A3":
        raise ge_graph.unsupported(op, "MC2's low-latency form in a graph is built for Atlas A3 only")
    if x_dtype not in _MC2_DTYPES:
        raise ge_graph.unsupported(op, "MC2 moves BF16/FP16 rows")


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

    op = "ep_low_latency_dispatch"
    meta = types.SimpleNamespace(x=x.meta, topk_idx=topk_idx.meta, use_fp8=use_fp8, slot_weights=slot_weights)
    _ge_product(op, x.meta.dtype)
    if _ll_mc2_product(meta, x.meta.shape[1]) is None:
        raise ge_graph.unsupported(
            op,
            f"MC2 takes BF16/FP16 rows without use_fp8 or slot_weights, K <= {MC2_MAX_TOPK} and H + {CODE_COLUMNS} "
            f"in {list(MC2_HIDDEN['A3'])}",
        )
    # A graph has no header exchange: every rank is taken to run the same graph, with the same T (MC2's
    # global_bs = 0 form), and ids are not validated (as while capturing).
    ge = ge_graph.api()
    ranks, rank, name = _group_info(group_name)
    local, t_max = num_experts // ranks, num_max_dispatch_tokens_per_rank
    tokens = ge_graph.dim(topk_idx, 0, scalar=True)
    expert_ids, active = _fill_empty_slots_ge(topk_idx, num_experts)
    codes = ge.Add(ge.Mul(ge_graph.i64(rank), tokens), ge_graph.arange(tokens))  # rank * T + t
    rows = _with_codes_ge(x, codes, x.meta.dtype)
    converter = ge_graph.npu_converter("npu_moe_distribute_dispatch_v2")
    outs = _ll_dispatch_v2(converter, rows, expert_ids, active, name, ranks, rank, num_experts)
    recv_x, count, src_info, layout_range, row_map = _ll_layout_from_mc2_ge(
        outs.expand_x, outs.expert_token_nums, tokens, t_max, ranks, local
    )
    scales = ge.Fill(ge_graph.i64([local, ranks * t_max, 0]), ge.Const(0, ge_graph.ge_dtype(ABSENT)))
    state = _mc2_state_ge(row_map, outs.ep_recv_count, outs.expand_idx)  # expand_idx: assist_info_for_combine
    return recv_x, scales, count, src_info, layout_range, state


@npu_ge_converter("ep_low_latency_combine", ir="MoeDistributeCombineV2")
def ep_low_latency_combine_ge(
    x,
    topk_idx,
    topk_weights,
    src_info,
    layout_range,
    num_max_dispatch_tokens_per_rank,
    group_name,
    timeout_s,
    backend_state=None,
    meta_outputs=None,
):
    op = "ep_low_latency_combine"
    _ge_product(op, x.meta.dtype)
    if backend_state is None:
        raise ge_graph.unsupported(op, "MC2's combine needs the dispatch's backend_state (pass the dispatch's handle)")
    ge, zero = ge_graph.api(), ge_graph.i64(0)
    ranks, rank, name = _group_info(group_name)
    local = x.meta.shape[0]
    num_experts = ranks * local
    row_map, ep_recv_counts, assist_info = _split_state_ge(backend_state)
    expert_ids, active = _fill_empty_slots_ge(topk_idx, num_experts)
    f32 = torch.float32
    weights = ge.SelectV2(active, ge_graph.cast(topk_weights, f32), ge.Const(0.0, ge_graph.ge_dtype(f32)))
    flat = ge.Reshape(x, ge.ConcatV2([ge_graph.i64([-1]), ge_graph.dim(x, 2)], zero, N=2))
    rows = ge.GatherV2(flat, ge.Maximum(ge_graph.cast(row_map, torch.int64), zero), zero)
    rows = ge_graph.zero_rows(rows, ge.GreaterEqual(row_map, ge.Const(0, ge_graph.ge_dtype(torch.int32))), 1)
    pad = ge.Fill(
        ge.ConcatV2([ge_graph.dim(rows, 0), ge_graph.i64([CODE_COLUMNS])], zero, N=2),
        ge.Const(0, ge_graph.ge_dtype(x.meta.dtype)),
    )
    y = ge_graph.typed(ge.ConcatV2([rows, pad], ge_graph.i64(1), N=2), x.meta.dtype)
    converter = ge_graph.npu_converter("npu_moe_distribute_combine_v2")
    out = _ll_combine_v2(
        converter, y, expert_ids, assist_info, ep_recv_counts, weights, active, name, ranks, rank, num_experts
    )
    return ge.Slice(out, ge_graph.i64([0, 0]), ge.ConcatV2([ge_graph.i64([-1]), ge_graph.dim(x, 2)], zero, N=2))


__all__ = [
    "MC2Expanded",
    "MC2Handle",
    "combine_expanded",
    "dispatch_expand",
    "ep_low_latency_dispatch",
    "hccl_comm_name",
    "ll_layout_from_mc2",
]

stays_portable(
    "ep_dispatch",
    "ep_dispatch_cached",
    "ep_combine",
    device="npu",
    why=(
        "MC2's rows are per (token, expert) in its own order with opaque state; the portable transport "
        "(all_to_all_single over HCCL) keeps the op's order and handle"
    ),
)
stays_portable(
    "ep_expand",
    "ep_dispatch_layout",
    device="npu",
    why="local index math, portable (ACLNN ops); npu_moe_init_routing_v2 is only the local analogue",
)
