"""Sample inputs, fp64 references, bad inputs and the harness specs of the ep family, on a one-rank gloo group
(the multi-rank checks that tests/ep runs in spawned gloo processes are in ``tests.distributed.ep_bodies``)."""

from __future__ import annotations

import datetime
import os
import tempfile

import torch
import torch.distributed as dist

from torch_ascend_moe.backends.portable.ep.combine import ep_combine
from torch_ascend_moe.backends.portable.ep.dispatch import ep_dispatch, ep_dispatch_cached
from torch_ascend_moe.backends.portable.ep.expand import ep_expand
from torch_ascend_moe.backends.portable.ep.layout import layout
from torch_ascend_moe.backends.portable.ep.low_latency import _ll_cast, ep_low_latency_combine, ep_low_latency_dispatch
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

# ---- one-rank harness specs ----

_STORE = os.path.join(tempfile.gettempdir(), f"ascend_moe_ep_store_{os.getpid()}")
FRESH_SETUP = """
import datetime, os, tempfile, torch.distributed as dist
if not dist.is_initialized():
    store = dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
"""


def init_single_rank_group() -> str:
    """A one-rank gloo group in this process (once); returns its name."""
    if not dist.is_initialized():
        store = dist.FileStore(_STORE, 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    return dist.distributed_c10d._get_default_group().group_name


def random_routing(t: int, k: int, e: int, g: torch.Generator) -> torch.Tensor:
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]) if t else torch.empty(0, k)
    idx = idx.long()
    if t:
        idx[torch.rand(t, k, generator=g) < 0.2] = -1  # empty slots
    return idx


def dispatch_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    name = init_single_rank_group()
    g = torch.Generator().manual_seed(5)
    out = []
    for t, h, k, e, align, worst in [(7, 16, 2, 4, 1, 0), (6, 8, 3, 6, 4, 10), (0, 8, 2, 4, 1, 0)]:
        x = torch.randn(t, h, generator=g).to(dtype).to(device).requires_grad_(requires_grad)
        idx = random_routing(t, k, e, g).to(device)
        w = torch.rand(t, k, generator=g, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
        w = w.to(device).requires_grad_(requires_grad)
        out.append(SampleInput((x, None, idx, w, e, name, align, worst, 60.0), f"T{t} H{h} K{k} E{e} worst{worst}"))
    # Neither scales nor weights: both absent outputs are placeholders, which must not alias each other.
    x = torch.randn(5, 8, generator=g).to(dtype).to(device).requires_grad_(requires_grad)
    out.append(SampleInput((x, None, random_routing(5, 2, 4, g).to(device), None, 4, name, 1, 0, 60.0), "no weights"))
    if dtype == torch.float32 and not requires_grad:
        x8 = torch.randn(5, 128, generator=g).to(torch.float8_e4m3fn).to(device)
        sf = torch.rand(5, 1, generator=g).to(device)
        out.append(SampleInput((x8, sf, random_routing(5, 2, 4, g).to(device), None, 4, name, 1, 0, 60.0), "FP8 rows"))
    return out


def dispatch_reference(
    x,
    x_scales,
    topk_idx,
    topk_weights,
    num_experts,
    group_name,
    expert_alignment,
    num_worst_tokens,
    timeout_s,
):
    """One rank owns every expert: every token with a valid slot arrives once, in token order."""
    t = x.shape[0]
    idx = topk_idx.long().cpu()
    tokens = [i for i in range(t) if (idx[i] >= 0).any()]
    n = num_worst_tokens or len(tokens)

    def take(v, fill=0):
        v = v.detach().cpu()
        out = torch.full((n, *v.shape[1:]), fill, dtype=v.dtype)
        out[: len(tokens)] = v[tokens]
        return out

    recv_x = take(x).double()
    scales = take(x_scales) if x_scales is not None else torch.empty(n, 0, dtype=torch.int32)
    recv_idx = take(idx, -1)
    weights = (
        take(torch.where(idx >= 0, topk_weights.detach().cpu(), 0)).double()
        if topk_weights is not None
        else (torch.empty(n, 0, dtype=torch.int32))
    )
    counts = torch.bincount(idx[idx >= 0], minlength=num_experts)
    counts = (counts + expert_alignment - 1) // expert_alignment * expert_alignment
    if num_worst_tokens:  # static: a padded send row per token, and the valid ones gathered in order
        send_src = torch.tensor([i if i in tokens else -1 for i in range(t)], dtype=torch.int64)
        sent = t
    else:
        send_src, sent = torch.tensor(tokens, dtype=torch.int64), len(tokens)
    gather = torch.tensor(tokens + [-1] * (n - len(tokens)), dtype=torch.int64)
    if not num_worst_tokens:
        gather = torch.arange(n)
    return (
        recv_x,
        scales,
        recv_idx,
        weights,
        counts.int(),
        torch.tensor([len(tokens)]),
        send_src,
        torch.tensor([sent]),
        torch.tensor([sent]),
        gather,
        torch.tensor(tokens + [-1] * (n - len(tokens)), dtype=torch.int64),  # recv_src_idx
        torch.empty(0, dtype=torch.int32),  # backend_state: one rank, so our transport (DeepEP needs 2 to 8)
    )


def combine_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    out = []
    for s in dispatch_samples(device, dtype, False, small):
        x, _, idx, w, e, name, align, worst, timeout = s.args
        if x.dtype == torch.float8_e4m3fn:
            continue
        res = torch.ops.ascend_moe.ep_dispatch(*s.args)
        g = torch.Generator().manual_seed(6)
        y = torch.randn(res[0].shape, generator=g).to(dtype).to(device).requires_grad_(requires_grad)
        rw = None if w is None else res[3].detach().clone().requires_grad_(requires_grad)  # no weights: none back
        t, h = x.shape
        b0 = torch.randn(t, h, generator=g).to(dtype).to(device).requires_grad_(requires_grad) if worst else None
        out.append(SampleInput((y, rw, b0, None, *res[6:10], t, name, timeout), s.name + (" bias" if worst else "")))
        if worst:
            order = torch.randint(0, 3, (t, 1), generator=g).to(device)
            out.append(SampleInput((y, rw, None, b0, *res[6:10], t, name, timeout, order), s.name + " copy_order"))
            state = res[11]  # the dispatch's backend_state (ours: empty) handed back
            out.append(SampleInput((y, rw, b0, None, *res[6:10], t, name, timeout, None, state), s.name + " state"))
    return out


def combine_reference(
    x,
    topk_weights,
    bias_0,
    bias_1,
    send_src,
    send_counts,
    recv_counts,
    recv_gather,
    num_tokens,
    group_name,
    timeout_s,
    copy_order,
    backend_state=None,
):
    """One rank: a token has one copy, so ``copy_order`` cannot change the sum (tests/distributed checks it)."""
    h = x.shape[1]
    out = torch.zeros(num_tokens, h, dtype=torch.float64)
    k = topk_weights.shape[1] if topk_weights is not None else 0
    out_w = torch.zeros(num_tokens, k, dtype=torch.float64)
    for b in (bias_0, bias_1):
        if b is not None:
            out += b.detach().double().cpu()
    gather = recv_gather.cpu()
    # One rank: output row j holds receive-buffer row gather[j], which is send row gather[j] (same rank).
    src = send_src.cpu()
    for j, r in enumerate(gather.tolist()):
        if r >= 0:
            out[src[r]] += x[j].detach().double().cpu()
            if k:
                out_w[src[r]] += topk_weights[j].detach().double().cpu()
    return out, out_w


def layout_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(7)
    return [
        SampleInput((random_routing(9, 3, 16, g).to(device), 16, 4, 8), "T9 K3 E16 R4"),
        SampleInput((random_routing(12, 4, 32, g).to(device), 32, 16, 8), "T12 K4 E32 R16 (2 nodes)"),
        SampleInput((random_routing(0, 2, 8, g).to(device), 8, 2, 8), "T0"),
    ]


def layout_reference(topk_idx, num_experts, num_ranks, ranks_per_node):
    idx = topk_idx.long().cpu()
    t, local = idx.shape[0], num_experts // num_ranks
    per_expert = torch.zeros(num_experts, dtype=torch.int64)
    in_rank = torch.zeros(t, num_ranks, dtype=torch.bool)
    for i in range(t):
        for e in idx[i].tolist():
            if e >= 0:
                per_expert[e] += 1
                in_rank[i, e // local] = True
    nodes = max(1, num_ranks // ranks_per_node)
    in_node = torch.zeros(t, nodes, dtype=torch.bool)
    for i in range(t):
        for r in range(num_ranks):
            if in_rank[i, r]:
                in_node[i, min(r // ranks_per_node, nodes - 1)] = True
    return in_rank.sum(0).int(), in_node.sum(0).int(), per_expert.int(), in_rank


def dispatch_bad_inputs(device) -> list[BadInput]:
    name = init_single_rank_group()
    x, idx, w = torch.randn(4, 8), torch.tensor([[0, 1], [2, -1], [3, 0], [1, 2]]), torch.rand(4, 2)
    return [
        BadInput(
            (x, None, idx.clone().fill_(7), w, 4, name, 1, 0, 60.0),
            r"argument 'topk_idx' values: expected expert ids in \[-1, 4\) on every rank",
            "expert id >= E",
            data_dependent=True,
        ),
        BadInput(
            (x, None, idx, w, 4, name, 1, 2, 60.0),
            r"argument 'num_worst_tokens' value: expected at least the rows every rank receives, got 2",
            "capacity too small",
            data_dependent=True,
        ),
        BadInput(
            (x, None, idx[:3], w[:3], 4, name, 1, 0, 60.0),
            r"argument 'topk_idx' size\(0\) \(T\): expected 4",
            "x/topk rows",
        ),
        BadInput(
            (x, None, idx, w[:, :1], 4, name, 1, 0, 60.0),
            r"argument 'topk_weights' shape: expected \[4, 2\]",
            "weights shape",
        ),
        BadInput(
            (x, None, idx, w, 4, name, 0, 0, 60.0),
            r"argument 'expert_alignment' value: expected a positive",
            "alignment",
        ),
        BadInput(
            (x.to(torch.float8_e4m3fn), None, idx, w, 4, name, 1, 0, 60.0),
            r"argument 'x_scales' value: expected the FP8 rows' scales",
            "FP8 without scales",
        ),
        BadInput(
            (x, None, idx, w, 4, "no-such-group", 1, 0, 60.0),
            r"argument 'group_name' value: expected the name of a live process group",
            "group",
        ),
    ]


def layout_bad_inputs(device) -> list[BadInput]:
    idx = torch.tensor([[0, 1], [2, -1]])
    return [
        BadInput(
            (idx, 6, 4, 8),
            r"argument 'num_experts' value: expected a multiple of the number of ranks \(4\), got 6",
            "E % R",
        ),
        BadInput((idx.float(), 8, 4, 8), r"argument 'topk_idx' dtype: expected torch.int64 or torch.int32", "dtype"),
        BadInput((idx, 8, 0, 8), r"argument 'num_ranks' value: expected a positive integer, got 0", "R"),
    ]


def combine_bad_inputs(device) -> list[BadInput]:
    s = combine_samples("cpu", torch.float32)[0]
    y, rw, b0, b1, *handle, t, name, timeout = s.args
    return [
        BadInput(
            (y[:, :4], rw, torch.randn(t, 8), b1, *handle, t, name, timeout),
            r"argument 'bias_0' shape: expected \[7, 4\] \(num_tokens, H\)",
            "bias shape",
        ),
        BadInput((y[:-1], rw, b0, b1, *handle, t, name, timeout), r"argument 'x' size\(0\) \(N\): expected", "rows"),
        BadInput(
            (y.to(torch.float8_e4m3fn), None, b0, b1, *handle, t, name, timeout),
            r"argument 'x' dtype: expected torch.bfloat16",
            "FP8 combine",
        ),
        BadInput(
            (y, rw, b0, b1, *handle, t, name, timeout, torch.zeros(t, 2, dtype=torch.long)),
            r"argument 'copy_order' shape: expected \[7, 1\] \(num_tokens, ranks\), got \[7, 2\]",
            "copy_order shape",
        ),
    ]


def cached_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    out = []
    for s in dispatch_samples(device, dtype, False, small):
        x, sf, *_rest = s.args
        res = torch.ops.ascend_moe.ep_dispatch(*s.args)
        g = torch.Generator().manual_seed(8)
        if x.dtype == torch.float8_e4m3fn:
            new = torch.randn(x.shape, generator=g).to(torch.float8_e4m3fn).to(device)
        else:
            new = torch.randn(x.shape, generator=g).to(dtype).to(device).requires_grad_(requires_grad)
        out.append(SampleInput((new, sf, *res[6:10], s.args[5], 60.0), s.name))
        if s.args[7]:  # static: the dispatch's backend_state (ours: empty) handed back too
            out.append(SampleInput((new, sf, *res[6:10], s.args[5], 60.0, res[11]), s.name + " state"))
    return out


def cached_reference(
    x, x_scales, send_src, send_counts, recv_counts, recv_gather, group_name, timeout_s, backend_state=None
):
    src, gather = send_src.cpu(), recv_gather.cpu()
    n = gather.shape[0]
    rows = [int(src[r]) if r >= 0 else -1 for r in gather.tolist()]
    data = x.detach().cpu().double()
    out = torch.zeros(n, data.shape[1], dtype=data.dtype)
    sc = torch.zeros(n, x_scales.shape[1]) if x_scales is not None else torch.zeros(n, 0, dtype=torch.int32)
    for j, r in enumerate(rows):
        if r >= 0:
            out[j] = data[r]
            if x_scales is not None:
                sc[j] = x_scales[r].cpu()
    return out, sc


def cached_bad_inputs(device) -> list[BadInput]:
    s = cached_samples("cpu", torch.float32)[0]
    x, sf, send_src, send_counts, recv_counts, recv_gather, name, timeout = s.args
    return [
        BadInput(
            (x, sf, send_src, send_counts.int(), recv_counts, recv_gather, name, timeout),
            r"argument 'send_counts' dtype: expected torch.int64",
            "handle dtype",
        ),
        BadInput(
            (x, sf, send_src, send_counts + 1, recv_counts, recv_gather, name, timeout),
            r"the handles do not pair up across ranks",
            "handle mismatch",
            data_dependent=True,
        ),
    ]


def ll_dispatch_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    name = init_single_rank_group()
    g = torch.Generator().manual_seed(9)
    out = []
    for t, t_max, h, k, e in [(5, 8, 16, 2, 4), (3, 4, 8, 3, 6), (0, 2, 8, 2, 4)]:
        x = torch.randn(t, h, generator=g).to(dtype).to(device).requires_grad_(requires_grad)
        out.append(
            SampleInput(
                (x, random_routing(t, k, e, g).to(device), t_max, e, name, False, False, False, None, 60.0),
                f"T{t} T_max{t_max} H{h} K{k} E{e}",
            )
        )
    if dtype == torch.float32 and not requires_grad:
        for round_scale, ue8m0 in ((False, False), (True, True)):
            x = torch.randn(4, 512, generator=g).to(device)
            out.append(
                SampleInput(
                    (x, random_routing(4, 2, 4, g).to(device), 6, 4, name, True, round_scale, ue8m0, None, 60.0),
                    f"FP8 round_scale={round_scale} ue8m0={ue8m0}",
                )
            )
    return out


def ll_dispatch_reference(
    x,
    topk_idx,
    t_max,
    num_experts,
    group_name,
    use_fp8,
    round_scale,
    use_ue8m0,
    slot_weights,
    timeout_s,
):
    """One rank: expert e's rows are the tokens that chose it, ascending; FP8 through DeepEP's cast."""
    idx = topk_idx.long().cpu()
    data = x.detach().cpu()
    if use_fp8:
        data, scales = _ll_cast(data, round_scale, use_ue8m0)
    rows = t_max
    recv = torch.zeros(num_experts, rows, x.shape[1], dtype=torch.float64)
    sc = torch.zeros(
        num_experts, rows, scales.shape[1] if use_fp8 else 0, dtype=(scales.dtype if use_fp8 else torch.int32)
    )
    count = torch.zeros(num_experts, dtype=torch.int32)
    src = torch.full((num_experts, rows), -1, dtype=torch.int32)
    for e in range(num_experts):
        tokens = [t for t in range(idx.shape[0]) if e in idx[t].tolist()]
        count[e] = len(tokens)
        for j, t in enumerate(tokens):
            recv[e, j], src[e, j] = data[t].double(), t
            if use_fp8:
                sc[e, j] = scales[t]
    layout_range = count.long().view(-1, 1)  # one source (begin 0)
    return recv, sc, count, src, layout_range, torch.empty(0, dtype=torch.int32)  # no backend state off Ascend


def ll_combine_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    out = []
    for s in ll_dispatch_samples(device, dtype, False, small):
        x, idx, t_max, e, name, use_fp8, *_ = s.args
        if use_fp8:
            continue
        _, _, _, src_info, layout_range, state = torch.ops.ascend_moe.ep_low_latency_dispatch(*s.args)
        g = torch.Generator().manual_seed(10)
        y = torch.randn(e, t_max, x.shape[1], generator=g).to(dtype).to(device).requires_grad_(requires_grad)
        w_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        w = torch.rand(idx.shape, generator=g, dtype=w_dtype).to(device).requires_grad_(requires_grad)
        out.append(SampleInput((y, idx, w, src_info, layout_range, t_max, name, 60.0, state), s.name))
    return out


def ll_combine_reference(
    x, topk_idx, topk_weights, src_info, layout_range, t_max, group_name, timeout_s, backend_state=None
):
    idx = topk_idx.long().cpu()
    t = idx.shape[0]
    out = torch.zeros(t, x.shape[2], dtype=torch.float64)
    src = src_info.cpu()
    for i in range(t):
        for k, e in enumerate(idx[i].tolist()):
            if e >= 0:
                j = (src[e] == i).nonzero()[0, 0]
                out[i] += topk_weights[i, k].detach().double().cpu() * x[e, j].detach().double().cpu()
    return out


def ll_dispatch_bad_inputs(device) -> list[BadInput]:
    name = init_single_rank_group()
    x, idx = torch.randn(4, 256), torch.tensor([[0, 1], [2, -1], [3, 0], [1, 2]])
    return [
        BadInput(
            (x, idx, 3, 4, name, True, False, False, None, 60.0),
            r"argument 'x' size\(0\) \(T\): expected at most num_max_dispatch_tokens_per_rank=3, got 4",
            "T > T_max",
        ),
        BadInput(
            (x[:, :100], idx, 8, 4, name, True, False, False, None, 60.0),
            r"argument 'x' size\(1\) \(H\): expected a multiple of 128",
            "H",
        ),
        BadInput(
            (torch.randn(4, 512), idx, 8, 4, name, True, False, True, None, 60.0),
            r"argument 'use_ue8m0' value: expected False unless round_scale",
            "ue8m0",
        ),
        BadInput(
            (x, torch.tensor([[0, 0], [2, -1], [3, 0], [1, 2]]), 8, 4, name, False, False, False, None, 60.0),
            r"expected distinct experts in each row",
            "repeated expert",
            data_dependent=True,
        ),
        BadInput(
            (x, idx.clone().fill_(9), 8, 4, name, False, False, False, None, 60.0),
            r"argument 'topk_idx' values: expected expert ids in \[-1, 4\)",
            "expert id >= E",
            data_dependent=True,
        ),
    ]


def ll_combine_bad_inputs(device) -> list[BadInput]:
    s = ll_combine_samples("cpu", torch.float32)[0]
    y, idx, w, src_info, layout_range, t_max, name, timeout, state = s.args
    return [
        BadInput(
            (y, idx, w[:, :1], src_info, layout_range, t_max, name, timeout, state),
            r"argument 'topk_weights' shape: expected \[5, 2\]",
            "weights",
        ),
        BadInput(
            (y[:, :4], idx, w, src_info, layout_range, t_max, name, timeout, state),
            r"argument 'x' size\(1\): expected 8 \(R \* T_max\)",
            "rows",
        ),
        BadInput(
            (y, idx, w, src_info, layout_range, t_max, name, timeout, state.long()),
            r"argument 'backend_state' layout: expected a 1-D torch.int32 tensor \(the dispatch's backend_state\), "
            r"got 1-D torch.int64",
            "state dtype",
        ),
    ]


def expand_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(11)
    out = []
    for n, h, k, local, align, rows in [
        (7, 16, 3, 4, 1, 0),
        (6, 8, 2, 3, 4, 20),
        (5, 8, 4, 2, 128, 0),
        (0, 8, 2, 2, 4, 0),
    ]:
        x = torch.randn(n, h, generator=g).to(dtype).to(device).requires_grad_(requires_grad)
        idx = random_routing(n, k, local, g).to(device) if k <= local else random_routing(n, k, k, g) % local
        w_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        w = torch.rand(n, k, generator=g, dtype=w_dtype).to(device).requires_grad_(requires_grad)
        out.append(
            SampleInput((x, None, idx.to(device), w, local, align, rows), f"N{n} K{k} L{local} align{align} rows{rows}")
        )
    if dtype == torch.float32 and not requires_grad:
        x8 = torch.randn(5, 128, generator=g).to(torch.float8_e4m3fn).to(device)
        sf = torch.rand(5, 1, generator=g).to(device)
        out.append(SampleInput((x8, sf, random_routing(5, 2, 4, g).to(device), None, 4, 2, 0), "FP8 rows"))
    return out


def expand_reference(x, x_scales, topk_idx, topk_weights, num_local_experts, expert_alignment, num_rows):
    """Loops: expert by expert, rows in order, each block padded up to the alignment."""
    idx = topk_idx.long().cpu()
    n, k = idx.shape
    blocks, expand_rows = [], torch.full((n, k), -1, dtype=torch.int64)
    psum, counts, start = [], [], 0
    for e in range(num_local_experts):
        slots = [(j, s) for j in range(n) for s in range(k) if idx[j, s] == e]
        for i, (j, s) in enumerate(slots):
            expand_rows[j, s] = start + i
        blocks += slots + [None] * (-len(slots) % expert_alignment)
        counts.append(len(slots))
        psum.append(start + len(slots))
        start = len(blocks)
    m = num_rows or len(blocks)
    blocks += [None] * (m - len(blocks))
    xd = x.detach().cpu()
    ex = torch.zeros(m, x.shape[1], dtype=torch.float64)
    es = torch.zeros(
        m,
        x_scales.shape[1] if x_scales is not None else 0,
        dtype=x_scales.dtype if x_scales is not None else torch.int32,
    )
    ew = (
        torch.zeros(m if topk_weights is not None else 0, dtype=torch.float64)
        if topk_weights is not None
        else torch.empty(0, dtype=torch.int32)
    )
    for row, slot in enumerate(blocks):
        if slot is not None:
            ex[row] = xd[slot[0]].double()
            if x_scales is not None:
                es[row] = x_scales[slot[0]].cpu()
            if topk_weights is not None:
                ew[row] = topk_weights[slot].detach().double().cpu()
    return ex, es, ew, expand_rows, torch.tensor(psum, dtype=torch.int32), torch.tensor(counts, dtype=torch.int32)


def expand_bad_inputs(device) -> list[BadInput]:
    x, idx, w = torch.randn(4, 8), torch.tensor([[0, 1], [2, -1], [1, 0], [1, 2]]), torch.rand(4, 2)
    return [
        BadInput((x, None, idx[:3], w, 3, 1, 0), r"argument 'topk_idx' size\(0\) \(N\): expected 4", "rows"),
        BadInput((x, None, idx, w[:, :1], 3, 1, 0), r"argument 'topk_weights' shape: expected \[4, 2\]", "weights"),
        BadInput(
            (x, None, idx, w, 0, 1, 0),
            r"argument 'num_local_experts' value: expected a positive integer, got 0",
            "experts",
        ),
        BadInput(
            (x, None, idx, w, 3, 0, 0),
            r"argument 'expert_alignment' value: expected a positive integer, got 0",
            "alignment",
        ),
        BadInput(
            (x, None, idx, w, 3, 1, -2),
            r"argument 'num_rows' value: expected a non-negative integer, got -2",
            "num_rows",
        ),
        BadInput((x, None, idx.float(), w, 3, 1, 0), r"argument 'topk_idx' dtype: expected torch.int64", "idx dtype"),
        BadInput(
            (x, None, idx, w, 2, 1, 0),
            r"argument 'topk_idx' values: expected local expert ids in \[-1, 2\), got 2",
            "id >= L",
            data_dependent=True,
        ),
        BadInput(
            (x, None, idx, w, 3, 4, 8),
            r"argument 'num_rows' value: expected at least the layout's 12 rows",
            "num_rows too small",
            data_dependent=True,
        ),
    ]


_NO_AOTI = "kernels are Python on torch.distributed: an AOTInductor (C++-only) deployment cannot run them"
_DTYPES = (torch.bfloat16, torch.float32)
# The one-rank group is gloo (CPU tensors); CUDA runs need an NCCL group (tests/ep does not start one yet).
_DEVICES = ("cpu",)
SPECS = [
    OpSpec(
        "ep_dispatch_layout",
        layout_samples,
        layout_reference,
        layout_bad_inputs,
        layout,
        dtypes=(torch.float32,),
        gradcheck="integer outputs: nothing to differentiate",
        aoti=_NO_AOTI,
        devices=_DEVICES,
    ),
    OpSpec(
        "ep_dispatch",
        dispatch_samples,
        dispatch_reference,
        dispatch_bad_inputs,
        ep_dispatch,
        dtypes=_DTYPES,
        aoti=_NO_AOTI,
        devices=_DEVICES,
        fresh_setup=FRESH_SETUP,
    ),
    OpSpec(
        "ep_dispatch_cached",
        cached_samples,
        cached_reference,
        cached_bad_inputs,
        ep_dispatch_cached,
        dtypes=_DTYPES,
        aoti=_NO_AOTI,
        devices=_DEVICES,
        fresh_setup=FRESH_SETUP,
    ),
    OpSpec(
        "ep_combine",
        combine_samples,
        combine_reference,
        combine_bad_inputs,
        ep_combine,
        dtypes=_DTYPES,
        aoti=_NO_AOTI,
        devices=_DEVICES,
        fresh_setup=FRESH_SETUP,
    ),
    OpSpec(
        "ep_expand",
        expand_samples,
        expand_reference,
        expand_bad_inputs,
        ep_expand,
        dtypes=_DTYPES,
        aoti=_NO_AOTI,
        devices=_DEVICES,
    ),
    OpSpec(
        "ep_low_latency_dispatch",
        ll_dispatch_samples,
        ll_dispatch_reference,
        ll_dispatch_bad_inputs,
        ep_low_latency_dispatch,
        dtypes=_DTYPES,
        aoti=_NO_AOTI,
        devices=_DEVICES,
        fresh_setup=FRESH_SETUP,
    ),
    OpSpec(
        "ep_low_latency_combine",
        ll_combine_samples,
        ll_combine_reference,
        ll_combine_bad_inputs,
        ep_low_latency_combine,
        dtypes=_DTYPES,
        aoti=_NO_AOTI,
        devices=_DEVICES,
        fresh_setup=FRESH_SETUP,
    ),
]
