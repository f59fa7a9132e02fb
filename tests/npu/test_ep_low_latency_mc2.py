"""``ep_low_latency_dispatch`` / ``ep_low_latency_combine`` on Ascend through MC2 (backends/npu/ep.py).

The layout comes from the source code each row carries in its extra columns, never from MC2's row order, and
the combine maps our rows back to MC2's through the dispatch's ``backend_state``. Checked (1) as pure functions
on simulated multi-rank MC2 outputs in random row order against a token-by-token simulation of our layout (eager
and GE forms), (2) end to end on one rank through torch_npu's schemas/metas and our CPU references of the MC2
ops, against the portable kernels, (3) for the cases that must stay on the portable transport, and (4) in
TorchAir's GE graphs evaluated on CPU."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.capture_emulation import capturing_everywhere
from tests.chains import npu_chain
from tests.ep.specs import init_single_rank_group
from tests.npu import ep_mqa_hc_refs as refs
from torch_ascend_moe.backends.npu import ep as npu_ep
from torch_ascend_moe.backends.portable.ep.low_latency import ep_low_latency_combine, ep_low_latency_dispatch
from torch_ascend_moe.fakes import ep as fakes
from torch_ascend_moe.testing import npu_wheel

A3, A2, ASCEND950 = 250, 223, 260


def _ids(t, k, e, g, empty=0.2):
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).long()
    idx[torch.rand(t, k, generator=g) < empty] = -1
    return idx


def _simulate(all_idx, all_x, rank, local, t_max):
    """Our layout on ``rank`` by the definition: per local expert, rows source-rank-major, tokens ascending; and
    where each (source, token) of each local expert lands (flat row)."""
    ranks, h = len(all_idx), all_x[0].shape[1]
    n = ranks * t_max
    recv_x = torch.zeros(local, n, h, dtype=all_x[0].dtype)
    src_info = torch.full((local, n), -1, dtype=torch.int32)
    per_source = torch.zeros(local, ranks, dtype=torch.int64)
    count = torch.zeros(local, dtype=torch.int32)
    where = {}
    for e in range(local):
        expert = rank * local + e
        for src in range(ranks):
            for t in range(all_idx[src].shape[0]):
                if (all_idx[src][t] == expert).any():
                    recv_x[e, count[e]] = all_x[src][t]
                    src_info[e, count[e]] = t
                    where[(e, src, t)] = e * n + int(count[e])
                    per_source[e, src] += 1
                    count[e] += 1
    begins = torch.cumsum(per_source, 1) - per_source
    return (recv_x, count, src_info, (begins << 32) | per_source), where


def _scenario(seed: int, min_ranks: int):
    """Random multi-rank routing: (generator, ranks, local experts, K, T, T_max, every rank's ids and rows)."""
    g = torch.Generator().manual_seed(seed)
    ranks, local, t = min_ranks + seed % 3, 1 + seed % 3, 4 + seed
    k = min(2, ranks * local)
    all_idx = [_ids(t, k, ranks * local, g) for _ in range(ranks)]
    dtype = torch.float16 if seed % 2 else torch.bfloat16
    all_x = [torch.randn(t, 8, generator=g).to(dtype) for _ in range(ranks)]
    return g, ranks, local, k, t, t + seed % 3, all_idx, all_x


def _mc2_outputs(all_idx, all_x, rank, local, k, g):
    """What MC2 hands ``rank``: its experts' rows (with the code columns every source appended) grouped by local
    expert, shuffled inside each expert (an order we do not assume), then unspecified rows; and each row's
    (local expert, source, token)."""
    ranks, t = len(all_idx), all_idx[0].shape[0]
    groups = []
    for le in range(local):
        rows = [
            (le, src, tt) for src in range(ranks) for tt in range(t) if (all_idx[src][tt] == rank * local + le).any()
        ]
        groups.append([rows[i] for i in torch.randperm(len(rows), generator=g).tolist()])
    flat = [row for grp in groups for row in grp]
    a = ranks * t * min(local, k)
    sent = [npu_ep.with_codes(all_x[src], src * t + torch.arange(t)) for src in range(ranks)]
    expand_x = (torch.randn(a, sent[0].shape[1], generator=g) * 1e4).to(all_x[0].dtype)  # garbage past the rows
    for i, (_, src, tt) in enumerate(flat):
        expand_x[i] = sent[src][tt]
    return expand_x, torch.tensor([len(grp) for grp in groups], dtype=torch.int64), flat


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_codes_ride_exactly_in_the_rows(dtype):
    g = torch.Generator().manual_seed(0)
    codes = torch.cat(
        [torch.tensor([0, 1, 255, 256, 65535, 65536, (1 << 24) - 1]), torch.randint(0, 1 << 24, (64,), generator=g)]
    )
    x = torch.randn(codes.numel(), 40, generator=g).to(dtype)
    rows = npu_ep.with_codes(x, codes)
    assert rows.shape == (codes.numel(), 40 + npu_ep.CODE_COLUMNS) and rows.dtype == dtype
    assert torch.equal(rows[:, :40], x) and torch.isfinite(rows).all()
    assert torch.equal(npu_ep.codes_of(rows), codes)
    # A byte copy (what MC2 does with unquantized rows) keeps them: the values are exact small integers.
    assert torch.equal(npu_ep.codes_of(rows.view(torch.int16).clone().view(dtype)), codes)


@pytest.mark.parametrize("seed", range(6))
def test_layout_and_row_map_from_mc2_whatever_mc2s_row_order(seed):
    g, ranks, local, k, t, t_max, all_idx, all_x = _scenario(seed, 1)
    for rank in range(ranks):
        expand_x, token_nums, flat = _mc2_outputs(all_idx, all_x, rank, local, k, g)
        *got, row_map = npu_ep.ll_layout_from_mc2(expand_x, token_nums, t, t_max, ranks)
        want, where = _simulate(all_idx, all_x, rank, local, t_max)
        for name, a_, b_ in zip(("recv_x", "recv_count", "src_info", "layout_range"), got, want):
            assert a_.dtype == b_.dtype and torch.equal(a_, b_), f"rank {rank}: {name}"
        # The combine's map: MC2's row i became our row row_map[i]; rows past the received ones map nowhere.
        assert row_map.dtype == torch.int32 and row_map.shape == (expand_x.shape[0],)
        assert row_map.tolist() == [where[row] for row in flat] + [-1] * (expand_x.shape[0] - len(flat))


def _combine_through_row_maps(all_idx, all_w, all_y, maps, flats, ranks, local):
    """What MC2's combine computes from the rows our combine hands it: source rank s's token t sums, over its
    valid slots in order, w[t, k] * (the row MC2 holds for (s, t) at expert idx[t, k]'s rank), in FP32 -- with
    that row read from our layout through the row map, as the adapter gathers it."""
    out = []
    for src in range(ranks):
        t, h = all_idx[src].shape[0], all_y[0].shape[-1]
        acc = torch.zeros(t, h)
        for tt in range(t):
            for kk, expert in enumerate(all_idx[src][tt].tolist()):
                if expert < 0:
                    continue
                owner, le = divmod(expert, local)
                i = flats[owner].index((le, src, tt))  # MC2's row of (s, t) on its expert's rank
                acc[tt] += all_w[src][tt, kk] * all_y[owner].reshape(-1, h)[maps[owner][i]].float()
        out.append(acc)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_combine_through_row_map_is_the_ll_combine_on_many_ranks(seed):
    """The combine gathers expert outputs back into MC2's rows with the row map: MC2's weighted sum over those rows
    equals the low-latency combine's definition (each slot's output read from our layout by src_info's
    position), on simulated ranks."""
    g, ranks, local, k, t, t_max, all_idx, all_x = _scenario(seed + 50, 2)
    maps, flats, ys, wheres = [], [], [], []
    for rank in range(ranks):
        expand_x, token_nums, flat = _mc2_outputs(all_idx, all_x, rank, local, k, g)
        row_map = npu_ep.ll_layout_from_mc2(expand_x, token_nums, t, t_max, ranks)[4]
        maps.append(row_map.tolist())
        flats.append(flat)
        ys.append(torch.randn(local, ranks * t_max, 8, generator=g))
        wheres.append(_simulate(all_idx, all_x, rank, local, t_max)[1])
    all_w = [torch.rand(t, k, generator=g) for _ in range(ranks)]
    got = _combine_through_row_maps(all_idx, all_w, ys, maps, flats, ranks, local)
    for src in range(ranks):
        want = torch.zeros(t, 8)
        for tt in range(t):
            for kk, expert in enumerate(all_idx[src][tt].tolist()):
                if expert >= 0:
                    owner, le = divmod(expert, local)
                    want[tt] += all_w[src][tt, kk] * ys[owner].reshape(-1, 8)[wheres[owner][(le, src, tt)]]
        assert torch.equal(got[src], want), f"source rank {src}"


@pytest.mark.parametrize("seed", range(3))
def test_ge_layout_from_mc2_is_ours_whatever_mc2s_row_order(seed, npu_ops):
    """The GE form of the layout and row map on the same simulated multi-rank MC2 outputs, evaluated on CPU."""
    from tests.npu import ge_eval

    g, ranks, local, k, t, t_max, all_idx, all_x = _scenario(seed + 100, 2)
    air = npu_wheel.torchair()
    for rank in range(ranks):
        expand_x, token_nums, flat = _mc2_outputs(all_idx, all_x, rank, local, k, g)
        want = npu_ep.ll_layout_from_mc2(expand_x, token_nums, t, t_max, ranks)
        with air.active():
            graph = ge_eval.build(
                lambda ex, tn, tk: npu_ep._ll_layout_from_mc2_ge(ex, tn, tk, t_max, ranks, local),
                expand_x,
                token_nums,
                torch.tensor(t),
            )
            got = ge_eval.evaluate(graph, [expand_x, token_nums, torch.tensor(t)])
        for name, a_, b_ in zip(("recv_x", "recv_count", "src_info", "layout_range", "row_map"), got, want):
            assert a_.dtype == b_.dtype and torch.equal(a_, b_), f"rank {rank}: {name}"


@pytest.fixture
def mc2(npu_ops, monkeypatch):
    """The one-rank CPU references of the MC2 ops, a dummy HCCL name, MC2's hidden range opened to test sizes,
    Atlas A3."""
    refs.register()
    monkeypatch.setattr(npu_ep, "hccl_comm_name", lambda group_name: f"hccl-dummy-{group_name}")
    monkeypatch.setattr(npu_ep, "MC2_HIDDEN", {"A3": (1, 8192), "A2": (1, 7168)})
    monkeypatch.setitem(npu_wheel.SOC, "version", A3)
    monkeypatch.setattr(npu_ep, "soc_version", lambda: npu_wheel.SOC["version"])  # no torch_npu to ask
    return init_single_rank_group()


def _args(x, idx, t_max, e, group, **kw):
    """The dispatch's positional arguments (what the dispatcher hands a kernel)."""
    full = {"use_fp8": False, "round_scale": False, "use_ue8m0": False, "slot_weights": None, "timeout_s": 60.0}
    full.update(kw)
    return (x, idx, t_max, e, group, *full.values())


def _combine_args(y, idx, w, dispatched, t_max, group, state):
    return (y, idx, w, dispatched[3], dispatched[4], t_max, group, 60.0, state)


def _spy(op):
    return mock.patch.object(op, "default", wraps=op.default)


def _expert_outputs(recv_x, count, g):
    """Expert outputs in the dispatch's layout: random rows where rows were received, garbage elsewhere (the
    combine must not read them)."""
    y = torch.randn(recv_x.shape, generator=g).to(recv_x.dtype)
    j = torch.arange(recv_x.shape[1]).unsqueeze(0)
    return torch.where((j < count.unsqueeze(1)).unsqueeze(-1), y, torch.full_like(y, 1e4))


@pytest.mark.parametrize("soc", [A3, A2])
@pytest.mark.parametrize("t, h, k, e, t_max", [(6, 32, 2, 4, 6), (5, 16, 3, 8, 9), (1, 8, 1, 2, 4)])
def test_one_rank_pair_equals_the_portable_kernels(mc2, monkeypatch, soc, t, h, k, e, t_max):
    monkeypatch.setitem(npu_wheel.SOC, "version", soc)
    g = torch.Generator().manual_seed(t * 100 + e)
    x = torch.randn(t, h, generator=g).bfloat16()
    idx = _ids(t, k, e, g, empty=0.2 if soc == A3 else 0.0)  # A2 masks tokens, not slots
    args = _args(x, idx, t_max, e, mc2)
    with _spy(torch.ops.npu.npu_moe_distribute_dispatch_v2) as call:
        got = npu_chain.ep_low_latency_dispatch(*args)
    assert call.called
    want = ep_low_latency_dispatch(*args)
    for i, (a_, b_) in enumerate(zip(got[:5], want[:5], strict=True)):
        assert a_.shape == b_.shape and a_.dtype == b_.dtype and torch.equal(a_, b_), f"output {i}"
    state = got[5]
    assert state.dtype == torch.int32 and state.dim() == 1 and state.numel() > 3 and want[5].numel() == 0
    row_map, _, _ = npu_ep.split_state(state, "test")
    assert row_map.numel() == t * min(e, k)  # A = Bs * R * min(L, K)
    w = torch.rand(t, k, generator=g)
    y = _expert_outputs(got[0], got[2], g)
    with _spy(torch.ops.npu.npu_moe_distribute_combine_v2) as call:
        combined = npu_chain.ep_low_latency_combine(*_combine_args(y, idx, w, got, t_max, mc2, state))
    assert call.called
    # The reference of combine_v2 sums the slots in order in FP32, as ours: bitwise here (CANN's order may differ).
    reference = ep_low_latency_combine(*_combine_args(y, idx, w, got, t_max, mc2, None))
    assert combined.dtype == reference.dtype and torch.equal(combined, reference)


def test_one_rank_meta_through_torch_npu(mc2):
    """Under FakeTensorMode the MC2 calls go through torch_npu's own Meta kernels: the dispatch's outputs have
    our fake's shapes and dtypes (its state: 1-D int32, sized by MC2's meta rules), and the combine's call is
    accepted with [T, H + CODE_COLUMNS] out."""
    t, h, k, e, t_max = 6, 32, 2, 4, 8
    x, idx = torch.randn(t, h).bfloat16(), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0], [0, 2], [1, -1]])
    with FakeTensorMode() as mode:
        fx, fidx = mode.from_tensor(x), mode.from_tensor(idx)
        got = npu_chain.ep_low_latency_dispatch(*_args(fx, fidx, t_max, e, mc2))
        ours = torch.ops.ascend_moe.ep_low_latency_dispatch(fx, fidx, t_max, e, mc2, use_fp8=False)
        for a_, b_ in zip(got[:5], ours[:5], strict=True):
            assert (a_.shape, a_.dtype) == (b_.shape, b_.dtype)
        a = t * min(e, k)
        assert got[5].dtype == torch.int32 and got[5].shape[0] == 3 + a + e + max(t * k, 128 * a)
        ids, w, active = npu_ep._routing(fidx, torch.empty(t, k), e, True)
        out = npu_ep._ll_combine_v2(
            torch.ops.npu.npu_moe_distribute_combine_v2.default,
            torch.empty(a, h + npu_ep.CODE_COLUMNS, dtype=torch.bfloat16),
            ids,
            torch.empty(max(t * k, 128 * a), dtype=torch.int32),
            torch.empty(e, dtype=torch.int32),
            w,
            active,
            "hccl-dummy",
            1,
            0,
            e,
        )
        assert out.shape == (t, h + npu_ep.CODE_COLUMNS) and out.dtype == torch.bfloat16


_FAKE_ON_PRIVATEUSE1 = """
import types, torch, torch_ascend_moe
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from tests.ep.specs import init_single_rank_group
name = init_single_rank_group()
module = types.SimpleNamespace(is_initialized=lambda: False, is_available=lambda: False, device_count=lambda: 0)
torch._register_device_module("privateuseone", module)  # what torch_npu's rename gives FakeTensor to ask
mode = FakeTensorMode(shape_env=ShapeEnv())
for device in ("cpu", "privateuseone:0"):
    with mode:
        x = FakeTensor(mode, torch.empty(4, 16, dtype=torch.bfloat16, device="meta"), torch.device(device))
        idx = FakeTensor(mode, torch.empty(4, 2, dtype=torch.int64, device="meta"), torch.device(device))
        out = torch.ops.ascend_moe.ep_low_latency_dispatch(x, idx, 4, 4, name, use_fp8=False)
        w = FakeTensor(mode, torch.empty(4, 2, device="meta"), torch.device(device))
        y = torch.ops.ascend_moe.ep_low_latency_combine(out[0], idx, w, out[3], out[4], 4, name, 60.0, out[5])
        print(device, out[5].dtype, out[5].shape[0], tuple(y.shape))
"""


def test_our_fake_leaves_the_state_size_to_the_device():
    """The state is empty off Ascend (a static 0) and data-dependent on it (an unbacked size: MC2's sizes come from
    its SoC's rules and the ranks' token counts); the combine takes either. A fresh process: the stand-in device
    module it registers for FakeTensor stays registered."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _FAKE_ON_PRIVATEUSE1], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.strip().splitlines()
    assert lines[0] == "cpu torch.int32 0 (4, 16)"
    device, dtype, size, shape = lines[1].split(" ", 3)
    assert (device, dtype, shape) == ("privateuseone:0", "torch.int32", "(4, 16)") and size.startswith("u")
    assert not fakes.keeps_backend_state(torch.device("cpu"))


@pytest.mark.parametrize(
    "case",
    [
        "fp8",
        "slot_weights",
        "fp32 rows",
        "hidden outside MC2's range",
        "capturing",
        "too many tokens",
        "Ascend 950",
        "A2 with an empty slot",
    ],
)
def test_dispatch_cases_that_stay_portable(mc2, monkeypatch, case):
    g = torch.Generator().manual_seed(3)
    t, h, k, e = 4, 16, 2, 4
    x, idx = torch.randn(t, h, generator=g).bfloat16(), _ids(t, k, e, g, empty=0.0)
    kw = {}
    if case == "fp8":
        x = torch.randn(t, 128, generator=g).bfloat16()
        kw["use_fp8"] = True
    elif case == "slot_weights":
        kw["slot_weights"] = torch.rand(t, k, generator=g)
    elif case == "fp32 rows":
        x = x.float()
    elif case == "hidden outside MC2's range":
        monkeypatch.setattr(npu_ep, "MC2_HIDDEN", {"A3": (1024, 8192), "A2": (32, 7168)})
    elif case == "too many tokens":
        monkeypatch.setattr(npu_ep, "MC2_MAX_TOKENS", {"A3": t - 1, "A2": t - 1})
    elif case == "Ascend 950":
        monkeypatch.setitem(npu_wheel.SOC, "version", ASCEND950)
    elif case == "A2 with an empty slot":
        monkeypatch.setitem(npu_wheel.SOC, "version", A2)
        idx[1, 0] = -1
    args = _args(x, idx, t, e, mc2, **kw)
    with mock.patch.object(torch.ops.npu.npu_moe_distribute_dispatch_v2, "default") as call:
        if case == "capturing":
            with capturing_everywhere():
                got = npu_chain.ep_low_latency_dispatch(*args)
        else:
            got = npu_chain.ep_low_latency_dispatch(*args)
    assert not call.called, case
    want = ep_low_latency_dispatch(*args)
    for a_, b_ in zip(got, want, strict=True):
        assert torch.equal(
            a_.view(torch.uint8) if a_.dtype.itemsize == 1 else a_,
            b_.view(torch.uint8) if b_.dtype.itemsize == 1 else b_,
        ), case
    assert got[5].numel() == 0


@pytest.mark.parametrize("case", ["no state", "empty state", "fp32 outputs", "A2 with an empty slot", "capturing"])
def test_combine_cases_that_stay_portable(mc2, monkeypatch, case):
    g = torch.Generator().manual_seed(4)
    t, h, k, e = 5, 16, 2, 4
    x, idx = torch.randn(t, h, generator=g).bfloat16(), _ids(t, k, e, g, empty=0.0)
    dispatched = npu_chain.ep_low_latency_dispatch(*_args(x, idx, t, e, mc2))
    state = dispatched[5]
    assert state.numel()
    y, w = _expert_outputs(dispatched[0], dispatched[2], g), torch.rand(t, k, generator=g)
    if case == "no state":
        state = None
    elif case == "empty state":
        state = state[:0]
    elif case == "fp32 outputs":
        y = y.float()
    elif case == "A2 with an empty slot":
        monkeypatch.setitem(npu_wheel.SOC, "version", A2)
        idx = idx.clone()
        idx[0, 1] = -1
    args = _combine_args(y, idx, w, dispatched, t, mc2, state)
    with mock.patch.object(torch.ops.npu.npu_moe_distribute_combine_v2, "default") as call:
        if case == "capturing":
            with capturing_everywhere():
                got = npu_chain.ep_low_latency_combine(*args)
        else:
            got = npu_chain.ep_low_latency_combine(*args)
    assert not call.called, case
    assert torch.equal(got, ep_low_latency_combine(*args)), case


@pytest.mark.parametrize("bad", ["truncated", "sizes", "rows outside x"])
def test_a_bad_state_is_refused_by_name(mc2, bad):
    g = torch.Generator().manual_seed(5)
    t, h, k, e = 4, 16, 2, 4
    x, idx = torch.randn(t, h, generator=g).bfloat16(), _ids(t, k, e, g)
    dispatched = npu_chain.ep_low_latency_dispatch(*_args(x, idx, t, e, mc2))
    state = dispatched[5].clone()
    if bad == "truncated":
        state = state[:-1]
    elif bad == "sizes":
        state[0] = -2
    else:
        state[3] = 10**6
    y, w = _expert_outputs(dispatched[0], dispatched[2], g), torch.rand(t, k, generator=g)
    with pytest.raises(ValueError, match=r"argument 'backend_state' value: expected the state ep_low_latency_disp"):
        npu_chain.ep_low_latency_combine(*_combine_args(y, idx, w, dispatched, t, mc2, state))


def test_the_op_refuses_a_state_of_another_dtype(mc2):
    """Every path (the fake included) checks the state's layout before any kernel."""
    g = torch.Generator().manual_seed(6)
    x, idx = torch.randn(4, 16, generator=g), _ids(4, 2, 4, g)
    recv, _, count, src_info, layout_range, state = torch.ops.ascend_moe.ep_low_latency_dispatch(
        x, idx, 4, 4, mc2, use_fp8=False
    )
    with pytest.raises(ValueError, match=r"argument 'backend_state' layout: expected a 1-D torch.int32 tensor"):
        torch.ops.ascend_moe.ep_low_latency_combine(
            recv, idx, torch.rand(4, 2), src_info, layout_range, 4, mc2, backend_state=state.float()
        )


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("t, h, k, e, t_max", [(6, 32, 2, 4, 6), (5, 16, 3, 8, 9)])
def test_ge_graph_pair_equals_the_portable_kernels(mc2, t, h, k, e, t_max, dynamic):
    """TorchAir GE mode: MoeDistributeDispatchV2 and MoeDistributeCombineV2 (torch_npu's converters) and our layout
    and row map in GE ops, in one graph; evaluated on CPU through the same MC2 references, bitwise the portable
    kernels (-1 slots included)."""
    from tests.npu import ge_eval

    air = npu_wheel.torchair()
    g = torch.Generator().manual_seed(t * 10 + k)
    x, idx = torch.randn(t, h, generator=g).bfloat16(), _ids(t, k, e, g)
    w = torch.rand(t, k, generator=g)
    assert (idx < 0).any()

    def fn(x, idx, w):
        recv, scales, count, src_info, layout_range, state = torch.ops.ascend_moe.ep_low_latency_dispatch(
            x, idx, t_max, e, mc2, use_fp8=False
        )
        y = recv * 2 - 1
        out = torch.ops.ascend_moe.ep_low_latency_combine(y, idx, w, src_info, layout_range, t_max, mc2, 60.0, state)
        return recv, scales, count, src_info, layout_range, out

    graph, _ = npu_wheel.ge_graph(fn, x, idx, w, dynamic=dynamic)
    types = [op.type for op in graph.op]
    assert types.count("MoeDistributeDispatchV2") == 1 and types.count("MoeDistributeCombineV2") == 1
    with air.active():
        got = ge_eval.evaluate(graph, [x, idx, w])
    want = list(ep_low_latency_dispatch(*_args(x, idx, t_max, e, mc2))[:5])
    want.append(ep_low_latency_combine(want[0] * 2 - 1, idx, w, want[3], want[4], t_max, mc2, 60.0, None))
    for i, (a_, b_) in enumerate(zip(got, want, strict=True)):
        assert a_.shape == b_.shape and a_.dtype == b_.dtype and torch.equal(a_, b_), f"output {i}"


@pytest.mark.parametrize("case", ["fp8", "Ascend 950", "A2", "combine without state"])
def test_ge_graph_has_none_where_mc2_cannot_take_the_call(mc2, monkeypatch, case):
    x, idx = torch.randn(4, 128).bfloat16(), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]])
    if case == "Ascend 950":
        monkeypatch.setitem(npu_wheel.SOC, "version", ASCEND950)
    elif case == "A2":
        monkeypatch.setitem(npu_wheel.SOC, "version", A2)
    op = "ep_low_latency_combine" if case == "combine without state" else "ep_low_latency_dispatch"

    def fn(x, i):
        if case == "combine without state":
            src = torch.zeros(4, 8, dtype=torch.int32)
            lr = torch.zeros(4, 1, dtype=torch.int64)
            return torch.ops.ascend_moe.ep_low_latency_combine(
                x.view(4, 1, 128).expand(4, 8, 128), i, i.float(), src, lr, 8, mc2
            )
        return torch.ops.ascend_moe.ep_low_latency_dispatch(x, i, 4, 4, mc2, use_fp8=case == "fp8")

    with pytest.raises(NotImplementedError, match=f"ascend_moe::{op}: no GE graph"):
        npu_wheel.ge_graph(fn, x, idx)


def test_ge_fill_empty_slots_is_the_eager_one(npu_ops):
    """-1 slots get the row's smallest unused experts, in slot order (MC2 wants rows duplicate-free even where
    masked): the GE form equals the eager one on rows with many empty slots."""
    from tests.npu import ge_eval

    g = torch.Generator().manual_seed(5)
    for t, k, e in [(16, 4, 6), (9, 3, 3), (7, 5, 12)]:
        idx = _ids(t, k, e, g, empty=0.5)
        idx[0] = -1  # a row with every slot empty
        want_ids, _, want_active = npu_ep._routing(idx, None, e, True)
        with npu_wheel.torchair().active():
            graph = ge_eval.build(lambda i, e=e: npu_ep._fill_empty_slots_ge(i, e), idx)
            got_ids, got_active = ge_eval.evaluate(graph, [idx])
        assert torch.equal(got_ids, want_ids) and torch.equal(got_active, want_active)
