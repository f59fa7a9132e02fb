"""The combine_residual rewrite (inductor_lowerings/combine_residual.py): ``moe_unpermute(...) + r`` and
``ep_combine(...)[0] + r`` take ``r`` as the combine's bias (one FP32 sum, one rounding). Golden graph, outputs within
the thresholds of the unrewritten compile and of fp64 and within an ulp of the exact sum (BF16 and FP32, with and
without weights), the expert-parallel combine on a one-rank group, near misses."""

from __future__ import annotations

import pytest
import torch
from expecttest import assert_expected_inline

from tests.inductor_lowerings.graphs import compiled
from tests.moe_routing.specs import random_topk, unpermute_reference
from torch_ascend_moe import inductor_lowerings
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.harness import THRESHOLDS

ops = torch.ops.ascend_moe


def _inputs(dtype=torch.float32, t=13, h=24, k=3, e=6, weighted=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    _, row_map, _ = ops.moe_permute(torch.zeros(t, 1), random_topk(t, k, e, g), e, 4)
    y = torch.randn(row_map.max().item() + 5, h, generator=g).to(dtype)
    w = torch.rand(t, k, generator=g) if weighted else None
    return y, row_map, w, torch.randn(t, h, generator=g).to(dtype)


def _residual(y, row_map, w, r):
    return ops.moe_unpermute(y, row_map, w) + r


def _residual_first(y, row_map, w, r):
    return r + ops.moe_unpermute(y, row_map, w)


def test_golden_graph():
    args = _inputs()
    _, before = compiled(_residual, *args, passes=False)
    _, after = compiled(_residual, *args, passes=True)
    assert_expected_inline(
        before,
        """\
moe_unpermute = moe_unpermute(arg0_1, arg1_1, arg2_1)
add = aten.add.Tensor(moe_unpermute, arg3_1)""",
    )
    assert_expected_inline(after, """moe_unpermute_default = moe_unpermute(arg0_1, arg1_1, arg2_1, arg3_1)""")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fn", [_residual, _residual_first], ids=["combine + r", "r + combine"])
@pytest.mark.parametrize("weighted", [True, False], ids=["weighted", "unweighted"])
def test_within_thresholds(dtype, fn, weighted):
    args = _inputs(dtype, weighted=weighted)
    before = inductor_lowerings.MATCHES["combine_residual"]
    got, graph = compiled(fn, *args, passes=True)
    assert "aten.add" not in graph and inductor_lowerings.MATCHES["combine_residual"] > before, graph
    want = fn(*args)
    ref = unpermute_reference(*args[:3]) + args[3].double()
    assert got.dtype == want.dtype == dtype
    assert calc_diff(got, ref) < THRESHOLDS[dtype] and calc_diff(got, want) < THRESHOLDS[dtype]
    ulp = torch.finfo(dtype).eps * ref.abs().max().item()
    assert (got.double() - ref).abs().max().item() <= ulp  # one rounding of the exact sum: within an ulp


def test_expert_parallel_combine_takes_the_residual_as_bias():
    from tests.ep.specs import init_single_rank_group
    from torch_ascend_moe.ops.ep import ep_combine, ep_dispatch

    group = init_single_rank_group()
    g = torch.Generator().manual_seed(3)
    x, r = torch.randn(9, 16, generator=g), torch.randn(9, 16, generator=g)
    idx = random_topk(9, 2, 4, g)

    def fn(x, idx, r):
        sent = ep_dispatch(x, idx, num_experts=4, group=group)
        out, _ = ep_combine(sent.recv_x * 2, sent.handle)
        return out + r

    before = inductor_lowerings.MATCHES["combine_residual"]
    got, graph = compiled(fn, x, idx, r, passes=True)
    assert inductor_lowerings.MATCHES["combine_residual"] == before + 1 and "aten.add(getitem" not in graph, graph
    want = fn(x, idx, r)
    assert calc_diff(got, want) < 1e-10


def _used_twice(y, row_map, w, r):
    out = ops.moe_unpermute(y, row_map, w)
    return out + r, out


def _broadcast(y, row_map, w, r):
    return ops.moe_unpermute(y, row_map, w) + r[0]


def _promoting(y, row_map, w, r):
    return ops.moe_unpermute(y.bfloat16(), row_map, w) + r


def _alpha(y, row_map, w, r):
    return torch.add(ops.moe_unpermute(y, row_map, w), r, alpha=2)


def _has_bias(y, row_map, w, r):
    return ops.moe_unpermute(y, row_map, w, r) + r


@pytest.mark.parametrize("fn", [_used_twice, _broadcast, _promoting, _alpha, _has_bias], ids=lambda f: f.__name__)
def test_near_misses_are_left_alone(fn):
    args = _inputs()
    got, graph = compiled(fn, *args, passes=True)
    assert "aten.add" in graph, graph
    want = fn(*args)
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        torch.testing.assert_close(a, b)
