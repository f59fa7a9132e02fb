"""``ep_low_latency_dispatch`` on Ascend through MC2 (backends/npu/ep.py): the layout comes from the source codes
MC2 returns per row (``expand_scales``), never from MC2's row order, so it is checked (1) as a pure function on
simulated multi-rank MC2 outputs in random row order against a token-by-token simulation of our layout, (2) end to
end on one rank through torch_npu's schema/meta and our CPU reference of the MC2 op, bitwise against the portable
kernel, and (3) for the cases that must stay on the portable transport."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.ep.specs import init_single_rank_group
from tests.npu import ep_mqa_hc_refs as refs
from torch_ascend_moe.backends.npu import ep as npu_ep
from torch_ascend_moe.backends.portable import ep as portable
from torch_ascend_moe.distributed import capture


def _ids(t, k, e, g, empty=0.2):
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).long()
    idx[torch.rand(t, k, generator=g) < empty] = -1
    return idx


def _simulate(all_idx, all_x, rank, local, t_max):
    """Our layout on ``rank`` by the definition: per local expert, rows source-rank-major, tokens ascending."""
    ranks, h = len(all_idx), all_x[0].shape[1]
    n = ranks * t_max
    recv_x = torch.zeros(local, n, h, dtype=all_x[0].dtype)
    src_info = torch.full((local, n), -1, dtype=torch.int32)
    per_source = torch.zeros(local, ranks, dtype=torch.int64)
    count = torch.zeros(local, dtype=torch.int32)
    for e in range(local):
        expert = rank * local + e
        for src in range(ranks):
            for t in range(all_idx[src].shape[0]):
                if (all_idx[src][t] == expert).any():
                    recv_x[e, count[e]] = all_x[src][t]
                    src_info[e, count[e]] = t
                    per_source[e, src] += 1
                    count[e] += 1
    begins = torch.cumsum(per_source, 1) - per_source
    return recv_x, count, src_info, (begins << 32) | per_source


def _scenario(seed: int, min_ranks: int):
    """Random multi-rank routing: (generator, ranks, local experts, K, T, T_max, every rank's ids and rows)."""
    g = torch.Generator().manual_seed(seed)
    ranks, local, t = min_ranks + seed % 3, 1 + seed % 3, 4 + seed
    k = min(2, ranks * local)
    all_idx = [_ids(t, k, ranks * local, g) for _ in range(ranks)]
    all_x = [torch.randn(t, 8, generator=g).bfloat16() for _ in range(ranks)]
    return g, ranks, local, k, t, t + seed % 3, all_idx, all_x


@pytest.mark.parametrize("seed", range(6))
def test_layout_from_mc2_is_ours_whatever_mc2s_row_order(seed):
    g, ranks, local, k, t, t_max, all_idx, all_x = _scenario(seed, 1)
    for rank in range(ranks):
        expand_x, token_nums, expand_scales = _mc2_outputs(all_idx, all_x, rank, local, k, g)
        got = npu_ep.ll_layout_from_mc2(expand_x, token_nums, expand_scales, t, t_max, ranks)
        want = _simulate(all_idx, all_x, rank, local, t_max)
        for name, a_, b_ in zip(("recv_x", "recv_count", "src_info", "layout_range"), got, want):
            assert a_.dtype == b_.dtype and torch.equal(a_, b_), f"rank {rank}: {name}"


@pytest.mark.parametrize("seed", range(4))
def test_ge_layout_from_mc2_is_ours_whatever_mc2s_row_order(seed, npu_ops):
    """The GE form of the layout on the same simulated multi-rank MC2 outputs, evaluated on CPU."""
    from tests.npu import ge_eval
    from torch_ascend_moe.testing import npu_wheel

    g, ranks, local, k, t, t_max, all_idx, all_x = _scenario(seed + 100, 2)
    air = npu_wheel.torchair()
    for rank in range(ranks):
        expand_x, token_nums, expand_scales = _mc2_outputs(all_idx, all_x, rank, local, k, g)
        want = _simulate(all_idx, all_x, rank, local, t_max)
        with air.active():
            graph = ge_eval.build(
                lambda ex, tn, es, tk: npu_ep._ll_layout_from_mc2_ge(ex, tn, es, tk, t_max, ranks, local),
                expand_x,
                token_nums,
                expand_scales,
                torch.tensor(t),
            )
            got = ge_eval.evaluate(graph, [expand_x, token_nums, expand_scales, torch.tensor(t)])
        for name, a_, b_ in zip(("recv_x", "recv_count", "src_info", "layout_range"), got, want):
            assert a_.dtype == b_.dtype and torch.equal(a_, b_), f"rank {rank}: {name}"


def _mc2_outputs(all_idx, all_x, rank, local, k, g):
    """What MC2 hands ``rank``: its experts' rows grouped by local expert, shuffled inside each expert (an order
    we do not assume), each with its source code, then unspecified rows."""
    ranks, t, h = len(all_idx), all_idx[0].shape[0], all_x[0].shape[1]
    groups = []
    for le in range(local):
        rows = [(src, tt) for src in range(ranks) for tt in range(t) if (all_idx[src][tt] == rank * local + le).any()]
        groups.append([rows[i] for i in torch.randperm(len(rows), generator=g).tolist()])
    flat = [row for grp in groups for row in grp]
    a = ranks * t * min(local, k)
    expand_x = torch.randn(a, h, generator=g).bfloat16() * 1e4  # garbage beyond the valid rows
    expand_scales = torch.full((a,), 12345.0)
    for i, (src, tt) in enumerate(flat):
        expand_x[i] = all_x[src][tt]
        expand_scales[i] = src * t + tt
    return expand_x, torch.tensor([len(grp) for grp in groups], dtype=torch.int64), expand_scales


@pytest.fixture
def mc2(npu_ops, monkeypatch):
    """The one-rank CPU reference of the MC2 ops, a dummy HCCL name, MC2's hidden range opened to test sizes."""
    refs.register()
    monkeypatch.setattr(npu_ep, "hccl_comm_name", lambda group_name: f"hccl-dummy-{group_name}")
    monkeypatch.setattr(npu_ep, "MC2_HIDDEN", (1, 8192))
    return init_single_rank_group()


def _args(x, idx, t_max, e, group, **kw):
    """The op's positional arguments (what the dispatcher hands a kernel)."""
    full = {"use_fp8": False, "round_scale": False, "use_ue8m0": False, "slot_weights": None, "timeout_s": 60.0}
    full.update(kw)
    return (x, idx, t_max, e, group, *full.values())


@pytest.mark.parametrize("t, h, k, e, t_max", [(6, 32, 2, 4, 6), (5, 16, 3, 8, 9), (1, 8, 1, 2, 4)])
def test_one_rank_equals_the_portable_kernel(mc2, t, h, k, e, t_max):
    g = torch.Generator().manual_seed(t * 100 + e)
    x, idx = torch.randn(t, h, generator=g).bfloat16(), _ids(t, k, e, g)
    args = _args(x, idx, t_max, e, mc2)
    with mock.patch.object(
        torch.ops.npu.npu_moe_distribute_dispatch_v2,
        "default",
        wraps=torch.ops.npu.npu_moe_distribute_dispatch_v2.default,
    ) as call:
        got = npu_ep.ep_low_latency_dispatch(*args)
    assert call.called
    want = portable.ep_low_latency_dispatch(*args)
    for i, (a_, b_) in enumerate(zip(got, want, strict=True)):
        assert a_.shape == b_.shape and a_.dtype == b_.dtype and torch.equal(a_, b_), f"output {i}"
    with FakeTensorMode() as mode:  # torch_npu's meta of the MC2 call; shapes and dtypes are our op's fake
        fx, fidx = mode.from_tensor(x), mode.from_tensor(idx)
        fake = npu_ep.ep_low_latency_dispatch(*_args(fx, fidx, t_max, e, mc2))
        ours = torch.ops.ascend_moe.ep_low_latency_dispatch(fx, fidx, t_max, e, mc2, use_fp8=False)
    for a_, b_ in zip(fake, ours, strict=True):
        assert (a_.shape, a_.dtype) == (b_.shape, b_.dtype)


@pytest.mark.parametrize(
    "case",
    ["fp8", "slot_weights", "fp32 rows", "hidden outside MC2's range", "capturing", "too many tokens"],
)
def test_cases_that_stay_portable(mc2, monkeypatch, case):
    g = torch.Generator().manual_seed(3)
    t, h, k, e = 4, 16, 2, 4
    x, idx = torch.randn(t, h, generator=g).bfloat16(), _ids(t, k, e, g)
    kw = {}
    if case == "fp8":
        h = 128
        x = torch.randn(t, h, generator=g).bfloat16()
        kw["use_fp8"] = True
    elif case == "slot_weights":
        kw["slot_weights"] = torch.rand(t, k, generator=g)
    elif case == "fp32 rows":
        x = x.float()
    elif case == "hidden outside MC2's range":
        monkeypatch.setattr(npu_ep, "MC2_HIDDEN", (1024, 8192))
    elif case == "too many tokens":
        monkeypatch.setattr(npu_ep, "MC2_MAX_TOKENS", t - 1)
    args = _args(x, idx, t, e, mc2, **kw)
    with mock.patch.object(torch.ops.npu.npu_moe_distribute_dispatch_v2, "default") as call:
        if case == "capturing":
            with capture.emulated():
                got = npu_ep.ep_low_latency_dispatch(*args)
        else:
            got = npu_ep.ep_low_latency_dispatch(*args)
    assert not call.called, case
    want = portable.ep_low_latency_dispatch(*args)
    for a_, b_ in zip(got, want, strict=True):
        assert torch.equal(
            a_.view(torch.uint8) if a_.dtype.itemsize == 1 else a_,
            b_.view(torch.uint8) if b_.dtype.itemsize == 1 else b_,
        ), case


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize("t, h, k, e, t_max", [(6, 32, 2, 4, 6), (5, 16, 3, 8, 9)])
def test_ge_graph_equals_the_portable_kernel(mc2, t, h, k, e, t_max, dynamic):
    """TorchAir GE mode: MoeDistributeDispatchV2 (torch_npu's converter) and our layout in GE ops; evaluated on CPU
    through the same MC2 reference, bitwise the portable kernel (-1 slots included)."""
    from tests.npu import ge_eval
    from torch_ascend_moe.testing import npu_wheel

    air = npu_wheel.torchair()
    g = torch.Generator().manual_seed(t * 10 + k)
    x, idx = torch.randn(t, h, generator=g).bfloat16(), _ids(t, k, e, g)
    assert (idx < 0).any()

    def fn(x, idx):
        return torch.ops.ascend_moe.ep_low_latency_dispatch(x, idx, t_max, e, mc2, use_fp8=False)

    graph, _ = npu_wheel.ge_graph(fn, x, idx, dynamic=dynamic)
    assert sum(op.type == "MoeDistributeDispatchV2" for op in graph.op) == 1
    with air.active():
        got = ge_eval.evaluate(graph, [x, idx])
    want = portable.ep_low_latency_dispatch(*_args(x, idx, t_max, e, mc2))
    for i, (a_, b_) in enumerate(zip(got, want, strict=True)):
        assert a_.shape == b_.shape and a_.dtype == b_.dtype and torch.equal(a_, b_), f"output {i}"


def test_ge_graph_fp8_has_none(mc2):
    from torch_ascend_moe.testing import npu_wheel

    x, idx = torch.randn(4, 128).bfloat16(), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 0]])
    with pytest.raises(NotImplementedError, match="ascend_moe::ep_low_latency_dispatch: no GE graph"):
        npu_wheel.ge_graph(lambda x, i: torch.ops.ascend_moe.ep_low_latency_dispatch(x, i, 4, 4, mc2), x, idx)


def test_ge_fill_empty_slots_is_the_eager_one(npu_ops):
    """-1 slots get the row's smallest unused experts, in slot order (MC2 wants rows duplicate-free even where
    masked): the GE form equals the eager one on rows with many empty slots."""
    from tests.npu import ge_eval
    from torch_ascend_moe.testing import npu_wheel

    g = torch.Generator().manual_seed(5)
    for t, k, e in [(16, 4, 6), (9, 3, 3), (7, 5, 12)]:
        idx = _ids(t, k, e, g, empty=0.5)
        idx[0] = -1  # a row with every slot empty
        want_ids, _, want_active = npu_ep._routing(idx, None, e, True)
        with npu_wheel.torchair().active():
            graph = ge_eval.build(lambda i, e=e: npu_ep._fill_empty_slots_ge(i, e), idx)
            got_ids, got_active = ge_eval.evaluate(graph, [idx])
        assert torch.equal(got_ids, want_ids) and torch.equal(got_active, want_active)
