"""The ep / mqa_logits / hc_prenorm mappings onto torch_npu ops (backends/npu/{ep,mqa_logits,hc_prenorm}.py).

Meta: each mapping runs under FakeTensorMode against torch_npu's real schemas and Meta kernels (the call
matches the schema: names, keyword-only layout, 7 outputs, ...) and its shapes / dtypes equal our ops' fakes.
Values: against CPU references of the npu ops' documented semantics (ep_mqa_hc_refs.py, our reading, not
Ascend's kernels), compared with our ops on the same inputs (the one-rank gloo group for ep).
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import torch_ascend_moe  # noqa: F401  (the ascend_moe ops)
from tests.ep.specs import init_single_rank_group
from tests.npu import ep_mqa_hc_refs as refs
from torch_ascend_moe.backends.npu import ep as npu_ep
from torch_ascend_moe.backends.npu import hc_prenorm as npu_hc
from torch_ascend_moe.backends.npu import mqa_logits as npu_mqa
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


@pytest.mark.parametrize("causal", [True, False])
def test_mqa_meta_matches_composition(refs_on, causal):
    s, s_kv, h, d, topk = 8, 24, 4, 32, 16
    ks, ke = npu_mqa.implied_ranges(s, None, None, s_kv, causal)
    with FakeTensorMode():
        q = torch.empty(s, h, d, dtype=torch.bfloat16)
        k = torch.empty(s_kv, d, dtype=torch.bfloat16)
        w = torch.empty(s, h, dtype=torch.bfloat16)
        ks_f, ke_f = torch.empty(s, dtype=torch.int32), torch.empty(s, dtype=torch.int32)
        values, indices = npu_mqa.mqa_logits_topk(q, k, w, ks_f, ke_f, topk, causal=causal)
        ref_v, ref_i = mqa_topk(mqa_logits(q, k, w, ks_f, ke_f), ks_f, ke_f, topk)
    assert (values.shape, values.dtype) == (ref_v.shape, ref_v.dtype) == ((s, topk), torch.bfloat16)
    assert (indices.shape, indices.dtype) == (ref_i.shape, ref_i.dtype)
    assert ks.shape == ke.shape == (s,)


@pytest.mark.parametrize(
    "lens_q, lens_k, causal, topk",
    [([8], [24], True, 16), ([8], [24], False, 8), ([3, 5], [10, 6], True, 12), ([4, 2], [4, 9], False, 5)],
)
def test_mqa_values_vs_composition(refs_on, lens_q, lens_k, causal, topk):
    """BF16: the indexer's reading (CPU reference: FP32 scores ranked in FP32, values rounded to BF16) through
    mqa_logits_topk = mqa_topk(mqa_logits(...)) with the implied ranges and FP32 logits (the BF16 weights
    widened exactly): same indices, same values after rounding. (With BF16 logits mqa_topk ranks the rounded
    values, so ties after rounding may order differently: which one the hardware does is not documented.)"""
    g = torch.Generator().manual_seed(sum(lens_q) * 7 + topk)
    s, s_kv, h, d = sum(lens_q), sum(lens_k), 4, 32
    q, k, w = _mqa_inputs(s, s_kv, h, d, g)
    cq = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()])
    ck = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()])
    multi = len(lens_q) > 1
    kw = {"cu_seqlens_q": cq, "cu_seqlens_k": ck} if multi else {}
    ks, ke = npu_mqa.implied_ranges(s, cq if multi else None, ck if multi else None, s_kv, causal)
    values, indices = npu_mqa.mqa_logits_topk(q, k, w, ks, ke, topk, causal=causal, validate=True, **kw)
    ref_v, ref_i = mqa_topk(mqa_logits(q, k, w.float(), ks, ke), ks, ke, topk)
    assert torch.equal(indices, ref_i)
    assert torch.equal(values, ref_v.to(torch.bfloat16))
    with pytest.raises(ValueError, match="implied_ranges"):
        npu_mqa.mqa_logits_topk(q, k, w, ks, ke + 1, topk, causal=causal, validate=True, **kw)


def test_mqa_compiles_fullgraph(refs_on):
    g = torch.Generator().manual_seed(2)
    q, k, w = _mqa_inputs(8, 24, 4, 32, g)
    ks, ke = npu_mqa.implied_ranges(8, None, None, 24, True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: npu_mqa.mqa_logits_topk(*a, 16), backend="aot_eager", fullgraph=True)
    for got, want in zip(compiled(q, k, w, ks, ke), npu_mqa.mqa_logits_topk(q, k, w, ks, ke, 16)):
        assert torch.equal(got, want)


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
