"""The indexer_topk rewrite (inductor_lowerings/indexer_topk.py): ``mqa_topk(mqa_logits(...))`` becomes one
``mqa_logits_topk``. The post-grad graph before and after (golden), compiled outputs bit for bit the unrewritten ones
(FP32, BF16 and FP8 operands with scales, ties and NaN among the logits, static and dynamic shapes), near misses."""

from __future__ import annotations

import pytest
import torch
from expecttest import assert_expected_inline

from tests.inductor_lowerings.graphs import assert_same, compiled
from tests.mqa_logits.specs import random_ranges
from torch_ascend_moe import inductor_lowerings

ops = torch.ops.ascend_moe


def _inputs(s=24, s_kv=40, h=4, d=32, fmt="fp32", seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, w = torch.randn(s, h, d, generator=g), torch.randn(s_kv, d, generator=g), torch.rand(s, h, generator=g)
    ks, ke = random_ranges(s, s_kv, g)
    q_sf = k_sf = None
    if fmt == "bf16":
        q, k = q.bfloat16(), k.bfloat16()
    elif fmt == "fp8":
        q_data, q_sf = ops.quantize_fp8(q.view(s * h, d), [1, d])
        q, q_sf = q_data.view(s, h, d), q_sf.view(s, h, 1)
        k, k_sf = ops.quantize_fp8(k, [1, d])
    elif fmt == "ties":
        q, k = q.round(), k.round()  # many equal logits: ties resolve to the lower position in both
    elif fmt == "nan":
        q[3, 1, 0] = float("nan")
    return q, q_sf, k, k_sf, w, ks, ke


def _indexer(topk=8, logits_dtype=None):
    def fn(q, q_sf, k, k_sf, w, ks, ke):
        logits = ops.mqa_logits(q, q_sf, k, k_sf, w, ks, ke, logits_dtype=logits_dtype)
        return ops.mqa_topk(logits, ks, ke, topk)

    return fn


def test_golden_graph():
    args = _inputs()
    _, before = compiled(_indexer(), *args, passes=False)
    _, after = compiled(_indexer(), *args, passes=True)
    assert_expected_inline(
        before,
        """\
mqa_logits = mqa_logits(arg0_1, None, arg1_1, None, arg2_1, arg3_1, arg4_1)
mqa_topk = mqa_topk(mqa_logits, arg3_1, arg4_1, 8)
getitem = getitem(mqa_topk, 0)
getitem_1 = getitem(mqa_topk, 1)""",
    )
    assert_expected_inline(
        after,
        """\
mqa_logits_topk_default = mqa_logits_topk(arg0_1, None, arg1_1, None, arg2_1, arg3_1, arg4_1, 8)
getitem_2 = getitem(mqa_logits_topk_default, 0)
getitem_3 = getitem(mqa_logits_topk_default, 1)""",
    )


@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp8", "ties", "nan"])
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_rewritten_equals_unrewritten(fmt, dynamic):
    args = _inputs(fmt=fmt)
    fn = _indexer(topk=8, logits_dtype=torch.bfloat16 if fmt == "bf16" else None)
    before = inductor_lowerings.MATCHES["indexer_topk"]
    got, graph = compiled(fn, *args, passes=True, dynamic=dynamic)
    assert "mqa_logits_topk" in graph and "mqa_topk(" not in graph
    assert inductor_lowerings.MATCHES["indexer_topk"] > before
    assert_same(got, fn(*args))


def _compressed(q, q_sf, k, k_sf, w, ks, ke):
    logits = ops.mqa_logits(q, q_sf, k, k_sf, w, ks, ke, 40)
    return ops.mqa_topk(logits, ks, ke, 8, compressed=True)


def _other_ranges(q, q_sf, k, k_sf, w, ks, ke):
    logits = ops.mqa_logits(q, q_sf, k, k_sf, w, ks, ke)
    return ops.mqa_topk(logits, ks, torch.minimum(ke, ks + 5), 4)


def _logits_reused(q, q_sf, k, k_sf, w, ks, ke):
    logits = ops.mqa_logits(q, q_sf, k, k_sf, w, ks, ke)
    values, idx = ops.mqa_topk(logits, ks, ke, 8)
    return values, idx, logits


NEAR_MISSES = {
    "compressed logits": _compressed,
    "top-k over other ranges": _other_ranges,
    "logits reused": _logits_reused,
}


@pytest.mark.parametrize("name", NEAR_MISSES, ids=str)
def test_near_misses_are_left_alone(name):
    fn, args = NEAR_MISSES[name], _inputs()
    got, graph = compiled(fn, *args, passes=True)
    assert "mqa_logits_topk" not in graph, graph
    assert_same(got, fn(*args))
