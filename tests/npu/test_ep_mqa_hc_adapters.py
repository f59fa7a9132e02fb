"""The ep / mqa_logits / hc_prenorm mappings onto torch_npu ops (backends/npu/{ep,mqa_logits,hc_prenorm}.py).

Meta: each mapping runs under FakeTensorMode against torch_npu's real schemas and Meta kernels (the call
matches the schema: names, keyword-only layout, 7 outputs, ...) and its shapes / dtypes equal our ops' fakes.
Values: against CPU references of the npu ops' documented semantics (ep_mqa_hc_refs.py, our reading, not
Ascend's kernels), compared with our ops on the same inputs (the one-rank gloo group for ep).
"""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_ascend_moe  # noqa: F401  (the ascend_moe ops)
from tests.capture_emulation import capturing_everywhere
from tests.chains import npu_chain
from tests.ep.specs import init_single_rank_group
from tests.mqa_logits import specs as T
from tests.npu import ep_mqa_hc_refs as refs
from torch_ascend_moe.backends.npu import ep as npu_ep
from torch_ascend_moe.backends.npu import hc_prenorm as npu_hc
from torch_ascend_moe.backends.npu import mqa_logits as npu_mqa
from torch_ascend_moe.backends.portable import mqa_logits as portable_mqa
from torch_ascend_moe.ops.ep import ep_dispatch, ep_expand, ep_low_latency_combine, ep_low_latency_dispatch
from torch_ascend_moe.ops.hc_prenorm import hc_prenorm_gemm
from torch_ascend_moe.ops.mqa_logits import mqa_logits, mqa_topk


@pytest.fixture(scope="module")
def refs_on(npu_ops):
    refs.register()
    return npu_ops


@pytest.fixture
def comm_name(monkeypatch):
    """The HCCL communicator name needs an NPU: a dummy string (MC2 ops only carry it)."""
    monkeypatch.setattr(npu_ep, "hccl_comm_name", lambda group_name: f"hccl-dummy-{group_name}")


def _routing(t, k, e, g, empty=True):
    idx = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).long()
    if empty:
        idx[torch.rand(t, k, generator=g) < 0.2] = -1
    return idx, torch.rand(t, k, generator=g)


# ---- ep ----


@pytest.mark.parametrize("t, h, k, e", [(6, 32, 2, 4), (5, 16, 3, 8)])
def test_ep_meta_matches_our_fakes(refs_on, comm_name, t, h, k, e):
    """dispatch_expand's shapes = ep_dispatch(num_worst_tokens=R*T) + ep_expand(num_rows=A)'s fakes, and
    combine_expanded's = ep_low_latency_combine's: MC2's 7-output schema and meta rules accept the calls."""
    name = init_single_rank_group()
    r, lcl = 1, e
    a = r * t * min(lcl, k)
    with FakeTensorMode():
        x = torch.empty(t, h, dtype=torch.bfloat16)
        idx = torch.zeros(t, k, dtype=torch.int64)
        w = torch.empty(t, k)
        out = npu_ep.dispatch_expand(x, idx, w, num_experts=e, group_name=name)
        ours = ep_dispatch(x, idx, w, num_experts=e, group=name, num_worst_tokens=r * t)
        exp = ep_expand(ours.recv_x, ours.recv_topk_idx, ours.recv_topk_weights, num_local_experts=lcl, num_rows=a)
        assert (out.x.shape, out.x.dtype) == (exp.x.shape, exp.x.dtype) == ((a, h), torch.bfloat16)
        for mine, theirs in ((out.counts, exp.counts), (out.psum, exp.psum)):
            assert (mine.shape, mine.dtype) == (theirs.shape, theirs.dtype)
        assert out.handle.expert_ids.dtype == torch.int32 and out.handle.active_mask.shape == (t, k)
        y = npu_ep.combine_expanded(out.x, out.handle)
        ll_x, _, ll_h = ep_low_latency_dispatch(x, idx, t, e, group=name, use_fp8=False)
        ll_y = ep_low_latency_combine(ll_x, idx, w, ll_h)
        assert (y.shape, y.dtype) == (ll_y.shape, ll_y.dtype) == ((t, h), torch.bfloat16)
        # A static capacity for ranks with fewer tokens: global_bs = R * T_max rows.
        big = npu_ep.dispatch_expand(x, idx, w, num_experts=e, group_name=name, num_max_tokens_per_rank=t + 3)
        assert big.x.shape == (r * (t + 3) * min(lcl, k), h)


def _expert_fn(rows, e):
    """A deterministic per-expert 'expert' (bf16 in, bf16 out)."""
    return (rows.float() * (e + 1) - 0.25 * e).to(rows.dtype)


@pytest.mark.parametrize(
    "t, h, k, e, empty, t_max",
    [(7, 16, 2, 4, True, 0), (6, 8, 3, 6, False, 0), (1, 8, 2, 2, True, 0), (5, 16, 2, 4, True, 8)],
)
def test_ep_values_one_rank(refs_on, comm_name, t, h, k, e, empty, t_max):
    """On one rank (CPU reference of MC2): the expanded rows are ep_expand's (after ep_dispatch) and the
    low-latency dispatch's per-expert rows, bitwise; counts equal; the weighted combine of per-expert outputs
    equals ep_low_latency_combine bitwise. ``t_max > 0``: a static capacity above this rank's T (global_bs)."""
    name = init_single_rank_group()
    g = torch.Generator().manual_seed(t * 100 + e)
    x = torch.randn(t, h, generator=g).to(torch.bfloat16)
    idx, w = _routing(t, k, e, g, empty)
    out = npu_ep.dispatch_expand(x, idx, w, num_experts=e, group_name=name, num_max_tokens_per_rank=t_max)
    a = (t_max or t) * min(e, k)
    assert out.x.shape == (a, h)
    n = int(out.counts.sum())
    assert n == int((idx >= 0).sum())
    # MC2 wants int32 ids without -1 or repeats in a row: empty slots get unused experts, masked out.
    ids = out.handle.expert_ids
    assert ids.dtype == torch.int32 and int(ids.min()) >= 0
    assert all(len(set(row)) == k for row in ids.tolist())
    assert torch.equal(torch.where(idx >= 0, ids.long(), -1), idx)
    assert torch.equal(out.handle.active_mask, idx >= 0)
    # ep_dispatch (static) + ep_expand: GEMM-ready rows, bitwise.
    ours = ep_dispatch(x, idx, w, num_experts=e, group=name, num_worst_tokens=t)
    exp = ep_expand(ours.recv_x, ours.recv_topk_idx, ours.recv_topk_weights, num_local_experts=e, num_rows=a)
    assert torch.equal(out.counts, exp.counts) and torch.equal(out.psum, exp.psum)
    assert torch.equal(out.x[:n], exp.x[:n])
    # The low-latency layout: expert e's rows are recv_x[e, :count[e]].
    ll_x, ll_count, ll_h = ep_low_latency_dispatch(x, idx, t_max or t, e, group=name, use_fp8=False)
    assert torch.equal(out.counts, ll_count)
    starts = (out.psum - out.counts).tolist()
    for ex in range(e):
        c = int(out.counts[ex])
        assert torch.equal(out.x[starts[ex] : starts[ex] + c], ll_x[ex, :c])
    # Weighted combine of the same expert outputs.
    y = torch.zeros_like(out.x)
    ll_y = torch.zeros_like(ll_x)
    for ex in range(e):
        c = int(out.counts[ex])
        y[starts[ex] : starts[ex] + c] = _expert_fn(out.x[starts[ex] : starts[ex] + c], ex)
        ll_y[ex, :c] = _expert_fn(ll_x[ex, :c], ex)
    combined = npu_ep.combine_expanded(y, out.handle)
    assert torch.equal(combined, ep_low_latency_combine(ll_y, idx, w, ll_h))


def test_ep_compiles_fullgraph(refs_on, comm_name):
    """dispatch_expand -> experts -> combine_expanded traces in one graph (the group's size, rank and comm name
    are trace-time constants) and runs the same as eager."""
    name = init_single_rank_group()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(6, 16, generator=g).to(torch.bfloat16)
    idx, w = _routing(6, 2, 4, g)

    def moe(x, idx, w):
        out = npu_ep.dispatch_expand(x, idx, w, num_experts=4, group_name=name)
        return npu_ep.combine_expanded(out.x * 2, out.handle)

    torch._dynamo.reset()
    compiled = torch.compile(moe, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x, idx, w), moe(x, idx, w))


def test_ep_comm_name_helper_is_isolated(monkeypatch):
    """The helper resolves the group by name and asks its NPU backend (stubbed here: no HCCL on CPU)."""
    name = init_single_rank_group()
    seen = {}

    class Backend:
        def get_hccl_comm_name(self, rank):
            seen["rank"] = rank
            return "hccl-comm-0"

    group = torch.distributed.distributed_c10d._resolve_process_group(name)
    monkeypatch.setattr(type(group), "_get_backend", lambda self, device: Backend(), raising=False)
    assert npu_ep.hccl_comm_name(name) == "hccl-comm-0" and seen["rank"] == 0


# ---- mqa_logits ----


def _mqa_inputs(s, s_kv, h, d, g, dtype=torch.bfloat16):
    q = torch.randn(s, h, d, generator=g).to(dtype)
    k = torch.randn(s_kv, d, generator=g).to(dtype)
    w = torch.rand(s, h, generator=g).to(dtype)
    return q, k, w


def _spy_indexer():
    return mock.patch.object(
        torch.ops.npu.npu_lightning_indexer, "default", wraps=torch.ops.npu.npu_lightning_indexer.default
    )


@pytest.mark.parametrize("causal", [True, False])
def test_mqa_meta_matches_our_fake(refs_on, causal):
    """The indexer call under FakeTensorMode (torch_npu's own Meta): values and indices have our op's fake's
    shapes and dtypes."""
    s, s_kv, h, d, topk = 8, 24, 4, 128, 16
    with FakeTensorMode():
        q, k, w = torch.empty(s, h, d, dtype=torch.bfloat16), torch.empty(s_kv, d, dtype=torch.bfloat16), None
        w = torch.empty(s, h, dtype=torch.bfloat16)
        values, indices = npu_mqa._indexer_call(q, k, w, [0, s], [0, s_kv], topk, causal)
        ks = torch.empty(s, dtype=torch.int32)
        ref_v, ref_i = torch.ops.ascend_moe.mqa_logits_topk(q, None, k, None, w, ks, ks, topk, None)
    assert (values.shape, values.dtype) == (ref_v.shape, ref_v.dtype) == ((s, topk), torch.bfloat16)
    assert (indices.shape, indices.dtype) == (ref_i.shape, ref_i.dtype)


def _is_a_topk_of(values, indices, logits, ks, ke):
    """Whether (values, indices) are a top-k of ``logits`` (BF16) over each query's range: the indices are distinct,
    in range, their values are the logits there, sorted descending, and no unchosen position is larger."""
    for i in range(logits.shape[0]):
        chosen = [int(j) for j in indices[i] if j >= 0]
        a, b = int(ks[i]), int(ke[i])
        if len(set(chosen)) != len(chosen) or any(not a <= j < b for j in chosen):
            return False
        if len(chosen) != min(indices.shape[1], b - a):
            return False
        got = values[i, : len(chosen)]
        if not torch.equal(got, logits[i, chosen]) or not torch.equal(got, got.sort(descending=True).values):
            return False
        rest = [j for j in range(a, b) if j not in set(chosen)]
        if rest and chosen and logits[i, rest].max() > got.min():
            return False
    return True


@pytest.mark.parametrize(
    "lens_q, lens_k, causal, topk",
    [([8], [24], True, 16), ([8], [24], False, 8), ([3, 5], [10, 6], True, 12), ([4, 2], [4, 9], False, 5)],
)
def test_mqa_logits_topk_through_the_indexer(refs_on, lens_q, lens_k, causal, topk):
    """BF16 q/k/weights with the ranges of the indexer's batches (one or several, causal or not): the adapter reads
    the batches off ks/ke and calls npu_lightning_indexer once. In our CPU reading of the indexer (FP32 scores
    ranked in FP32, values rounded to BF16) its output is mqa_topk of FP32 logits, rounded; and it is a top-k of
    our op's BF16 logits (ties after rounding may go either way: not documented)."""
    g = torch.Generator().manual_seed(sum(lens_q) * 7 + topk)
    s, s_kv, h, d = sum(lens_q), sum(lens_k), 4, 128
    q, k, w = _mqa_inputs(s, s_kv, h, d, g)
    cq = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()])
    ck = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()])
    ks, ke = npu_mqa.implied_ranges(s, cq, ck, s_kv, causal)
    assert npu_mqa.batches_of(ks.tolist(), ke.tolist()) == (cq.tolist(), ck.tolist(), causal)
    with _spy_indexer() as call, mock.patch.object(npu_mqa._BATCHES, "plan", wraps=npu_mqa._batches) as plan:
        values, indices = npu_chain.mqa_logits_topk(q, None, k, None, w, ks, ke, topk, None)
    assert call.call_count == 1
    assert plan.call_count == 1  # ks/ke read on the host once: the body runs the plan its takes made
    ref_v, ref_i = mqa_topk(mqa_logits(q, k, w.float(), ks, ke), ks, ke, topk)
    assert torch.equal(indices, ref_i) and torch.equal(values, ref_v.to(torch.bfloat16))
    ours_v, _ = torch.ops.ascend_moe.mqa_logits_topk(q, None, k, None, w, ks, ke, topk, None)
    assert values.dtype == ours_v.dtype
    assert _is_a_topk_of(values, indices, mqa_logits(q, k, w, ks, ke), ks, ke)


@pytest.mark.parametrize("seed", range(8))
def test_batches_of_reads_any_indexer_batching_back(seed):
    g = torch.Generator().manual_seed(seed)
    b = 1 + seed % 4
    lens_q = torch.randint(1, 7, (b,), generator=g)
    lens_k = lens_q + torch.randint(0, 9, (b,), generator=g)  # causal batches see at least their own queries
    cq = torch.cat([torch.zeros(1, dtype=torch.int64), lens_q.cumsum(0)])
    ck = torch.cat([torch.zeros(1, dtype=torch.int64), lens_k.cumsum(0)])
    for causal in (True, False):
        ks, ke = npu_mqa.implied_ranges(int(cq[-1]), cq, ck, int(ck[-1]), causal)
        found = npu_mqa.batches_of(ks.tolist(), ke.tolist())
        assert found is not None
        got_ks, got_ke = npu_mqa.implied_ranges(
            int(cq[-1]), torch.tensor(found[0]), torch.tensor(found[1]), 0, found[2]
        )
        assert torch.equal(got_ks, ks) and torch.equal(got_ke, ke)
    # DeepGEMM's causal test pattern (ke[i] = i + S_kv - S) is the indexer's causal batch over the first S_kv - 1
    # keys; random ranges are no batching.
    ks, ke = T.causal_ranges(8, 24)
    assert npu_mqa.batches_of(ks.tolist(), ke.tolist()) == ([0, 8], [0, 23], True)
    ks, ke = T.random_ranges(8, 24, g)
    assert npu_mqa.batches_of(ks.tolist(), ke.tolist()) is None


@pytest.mark.parametrize(
    "case",
    [
        "fp32 operands",
        "fp32 weights off the bf16 grid",
        "fp32 logits",
        "65 heads",
        "D 64",
        "topk 2049",
        "other ranges",
        "fp8 operands",
        "capturing",
    ],
)
def test_mqa_logits_topk_cases_that_stay_portable(refs_on, case):
    g = torch.Generator().manual_seed(9)
    s, s_kv, h, d, topk = 6, 20, 4, 128, 8
    q, k, w = _mqa_inputs(s, s_kv, h, d, g)
    q_sf = k_sf = out_dtype = None
    ks, ke = npu_mqa.implied_ranges(s, None, None, s_kv, True)
    if case == "fp32 operands":
        q, k, w = q.float(), k.float(), w.float()
        out_dtype = torch.bfloat16
    elif case == "fp32 weights off the bf16 grid":
        w, out_dtype = torch.rand(s, h, generator=g), torch.bfloat16
    elif case == "fp32 logits":
        w = w.float()
    elif case == "65 heads":
        q, k, w = _mqa_inputs(s, s_kv, 65, d, g)
    elif case == "D 64":
        q, k, w = _mqa_inputs(s, s_kv, h, 64, g)
    elif case == "topk 2049":
        topk = 2049
    elif case == "other ranges":
        ks, ke = T.random_ranges(s, s_kv, g)
    elif case == "fp8 operands":
        (q, q_sf), (k, k_sf) = T.quantize(q.float(), "fp8"), T.quantize(k.float(), "fp8-row")
        w, out_dtype = w.float(), torch.bfloat16
    args = (q, q_sf, k, k_sf, w, ks, ke, topk, out_dtype)
    with mock.patch.object(torch.ops.npu.npu_lightning_indexer, "default") as call:
        if case == "capturing":
            with capturing_everywhere():
                got = npu_chain.mqa_logits_topk(*args)
        else:
            got = npu_chain.mqa_logits_topk(*args)
    assert not call.called, case
    want = portable_mqa.mqa_logits_topk(*args)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), case


def test_mqa_logits_topk_takes_fp32_weights_on_the_bf16_grid(refs_on):
    g = torch.Generator().manual_seed(10)
    q, k, w = _mqa_inputs(6, 20, 4, 128, g)
    ks, ke = npu_mqa.implied_ranges(6, None, None, 20, False)
    with _spy_indexer() as call:
        values, _ = npu_chain.mqa_logits_topk(q, None, k, None, w.float(), ks, ke, 8, torch.bfloat16)
    assert call.called and values.dtype == torch.bfloat16


def test_mqa_logits_topk_bad_input_is_ours(refs_on):
    g = torch.Generator().manual_seed(11)
    q, k, w = _mqa_inputs(6, 20, 4, 128, g)
    ks, ke = npu_mqa.implied_ranges(6, None, None, 20, True)
    with pytest.raises(ValueError, match=r"mqa_logits_topk: argument 'ke' values: expected ke\[i\] <= S_kv=20"):
        npu_chain.mqa_logits_topk(q, None, k, None, w, ks, ke + 1, 8, None)


# ---- hc_prenorm ----


def test_hc_prenorm_h_mix_is_d(refs_on):
    """npu_mhc_pre's h_mix has our d's shape / dtype (meta) and, in our reading, its values up to TF32
    rounding of b (not bitwise: why no adapter); inv_rms relates to sqr_sum only through rsqrt."""
    n, dim, m = 4, 64, 5
    mat_k = n * n + 2 * n
    assert npu_hc.hc_streams(mat_k) == n and npu_hc.hc_streams(25) is None
    g = torch.Generator().manual_seed(3)
    a = torch.randn(m, n * dim, generator=g).to(torch.bfloat16)
    b = torch.randn(mat_k, n * dim, generator=g)
    alpha, bias = torch.full((3,), 0.5), torch.zeros(mat_k)
    with FakeTensorMode():
        fa, fb = torch.empty(a.shape, dtype=a.dtype), torch.empty(b.shape)
        x, phi = npu_hc.mhc_pre_operands(fa, fb)
        outs = torch.ops.npu.npu_mhc_pre(x, phi, torch.empty(3), torch.empty(mat_k), out_flag=1)
        d, sqr = hc_prenorm_gemm(fa, fb)
        assert len(outs) == 6 and (outs[4].shape, outs[4].dtype) == (d.shape, d.dtype)
        assert outs[3].shape == sqr.shape
    x, phi = npu_hc.mhc_pre_operands(a, b)
    _, _, _, inv_rms, h_mix, _ = torch.ops.npu.npu_mhc_pre(x, phi, alpha, bias, out_flag=1)
    d, sqr = hc_prenorm_gemm(a, b)
    torch.testing.assert_close(h_mix, d, rtol=2e-3, atol=2e-2)
    torch.testing.assert_close(inv_rms, torch.rsqrt(sqr / (n * dim) + 1e-6))
    with pytest.raises(ValueError, match="n\\^2 \\+ 2n"):
        npu_hc.mhc_pre_operands(a, b[:20])
