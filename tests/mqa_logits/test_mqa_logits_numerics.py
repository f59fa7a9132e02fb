"""mqa_logits numerics beyond the harness: DeepGEMM's thresholds on its (scaled-down) shapes and range
patterns, tiles and chunks crossing their boundaries, bitwise repeatability, masked gradients, and the
paged / compressed / top-k forms agreeing with each other."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import torch_ascend_moe as tam
from tests.mqa_logits import specs as T
from torch_ascend_moe.backends.portable import mqa_logits as portable
from torch_ascend_moe.checks import mqa_logits as mqa_checks
from torch_ascend_moe.testing import calc_diff


def _inputs(s, h, d, s_kv, pattern, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, h, d, generator=g).bfloat16()
    k = torch.randn(s_kv, d, generator=g).bfloat16()
    w = torch.randn(s, h, generator=g)  # DeepGEMM's test draws signed weights
    ks, ke = T.causal_ranges(s, s_kv) if pattern == "causal" else T.context_parallel_ranges(s, s_kv)
    return q, k, w, ks, ke


def _finite_diff(out, ref):
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite), "-inf mask differs"
    assert torch.equal(out[~finite], ref[~finite].to(out)), "masked entries are not exactly -inf"
    return calc_diff(out[finite], ref[finite])


@pytest.mark.parametrize("pattern", ["causal", "cp"])
@pytest.mark.parametrize(("h", "d"), [(32, 64), (64, 128), (8, 32)])
@pytest.mark.parametrize("compressed", [False, True])
def test_fp8_and_fp4_vs_unquantized(pattern, h, d, compressed):
    """DeepGEMM's end-to-end check: quantized logits vs the BF16 inputs' logits, < 1e-3 (FP8), < 0.02 (FP4)."""
    s, s_kv = 128, 512
    q, k, w, ks, ke = _inputs(s, h, d, s_kv, pattern)
    max_seqlen = int((ke - ks).max()) if compressed else 0
    columns = max_seqlen or s_kv
    ref = T.reference_logits(q.double(), k.double(), w, ks, ke, columns, compressed)
    # FP8: q cast without a scale, KV one FP32 scale per token (upstream's recipe).
    q8, _ = T.quantize(q, "fp8")
    k8, k8_sf = T.quantize(k, "fp8-row")
    out = tam.mqa_logits(q8, k8, w, ks, ke, k_sf=k8_sf, max_seqlen_k=max_seqlen)
    assert _finite_diff(out, ref) < 1e-3
    if d >= 64:  # FP4 needs 1x32 blocks; upstream runs it for D in {64, 128}
        (q4, q4_sf), (k4, k4_sf) = T.quantize(q, "fp4"), T.quantize(k, "fp4")
        out = tam.mqa_logits(q4, k4, w, ks, ke, q_sf=q4_sf, k_sf=k4_sf, max_seqlen_k=max_seqlen)
        assert _finite_diff(out, ref) < 0.02


@pytest.mark.parametrize(("q_fmt", "k_fmt"), [("fp8", "fp8-row"), ("fp4", "fp4"), ("fp8-32", "fp8-32")])
@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
def test_simulated_thresholds(q_fmt, k_fmt, logits_dtype):
    """Against the same formula on the dequantized inputs: < 5e-6 (FP32 weights and logits), < 3e-5 (BF16)."""
    q, k, w, ks, ke = _inputs(200, 64, 128, 1300, "cp", seed=1)  # 4 query tiles, 3 KV chunks
    (qq, q_sf), (kq, k_sf) = T.quantize(q, q_fmt), T.quantize(k, k_fmt)
    if logits_dtype == torch.bfloat16:
        w = w.bfloat16()
    out = tam.mqa_logits(qq, kq, w, ks, ke, q_sf=q_sf, k_sf=k_sf, logits_dtype=logits_dtype)
    assert out.dtype == logits_dtype
    ref = T.reference_logits(T.dequantized(qq, q_sf), T.dequantized(kq, k_sf), w, ks, ke, 1300, False)
    assert _finite_diff(out, ref) < (5e-6 if logits_dtype == torch.float32 else 3e-5)


def test_bitwise_repeatable():
    """20 calls, bitwise equal (the tiling depends on shapes only, never on threads)."""
    q, k, w, ks, ke = _inputs(96, 32, 64, 1100, "cp", seed=2)
    q8, (k8, k8_sf) = T.quantize(q, "fp8")[0], T.quantize(k, "fp8-row")
    first = tam.mqa_logits(q8, k8, w, ks, ke, k_sf=k8_sf)
    for _ in range(19):
        assert torch.equal(tam.mqa_logits(q8, k8, w, ks, ke, k_sf=k8_sf).view(torch.int32), first.view(torch.int32))
    paged = T.paged_samples("cpu", torch.float32)[0].args
    first = torch.ops.ascend_moe.paged_mqa_logits(*paged)
    for _ in range(19):
        assert torch.equal(torch.ops.ascend_moe.paged_mqa_logits(*paged).view(torch.int32), first.view(torch.int32))


@pytest.mark.parametrize("compressed", [False, True])
def test_gradients_vs_fp64_and_mask(compressed):
    """C++ backward (tiles x chunks) vs fp64 autograd of the reference; KV rows no query sees get no gradient,
    and gradient entries at masked positions change nothing."""
    g = torch.Generator().manual_seed(3)
    s, h, d, s_kv = 70, 8, 32, 1200
    q = torch.randn(s, h, d, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(s_kv, d, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(s, h, generator=g, dtype=torch.float64, requires_grad=True)
    ks = torch.randint(0, 400, (s,), generator=g, dtype=torch.int32)
    ke = (ks + torch.randint(0, 700, (s,), generator=g, dtype=torch.int32)).clamp(max=1100)  # rows >= 1100 unseen
    max_seqlen = int((ke - ks).max()) if compressed else 0
    out = tam.mqa_logits(q, k, w, ks, ke, max_seqlen_k=max_seqlen)
    grad = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, w), grad)
    ref = T.backward_reference(grad, q, None, k, None, w, ks, ke, max_seqlen, [True, True, True])
    for a, b, name in zip(got, ref, "qkw"):
        assert calc_diff(a, b) < 1e-12, name
    assert torch.count_nonzero(got[1][1100:]) == 0
    # Garbage in the masked entries of the incoming gradient must not leak in.
    noisy = torch.where(torch.isfinite(out), grad, torch.randn(out.shape, generator=g, dtype=torch.float64) * 1e6)
    again = torch.autograd.grad(tam.mqa_logits(q, k, w, ks, ke, max_seqlen_k=max_seqlen), (q, k, w), noisy)
    for a, b in zip(got, again):
        assert torch.equal(a, b)


def test_quantized_operands_give_weight_gradients_only():
    q, k, w, ks, ke = _inputs(16, 8, 64, 40, "causal", seed=4)
    q8, (k8, k8_sf) = T.quantize(q, "fp8")[0], T.quantize(k, "fp8-row")
    w = w.requires_grad_()
    out = tam.mqa_logits(q8, k8, w, ks, ke, k_sf=k8_sf)
    (gw,) = torch.autograd.grad(out.masked_fill(out.isinf(), 0).sum(), (w,))
    ref = T.backward_reference(torch.ones_like(out), q8, None, k8, k8_sf, w, ks, ke, 0, [False, False, True])[2]
    assert calc_diff(gw, ref) < 1e-10


def test_paged_equals_ragged_on_the_gathered_cache():
    for sample in T.paged_samples("cpu", torch.float32):
        q, q_sf, cache, w, lens, table, max_len, indices, ascend, dtype = sample.args
        out = torch.ops.ascend_moe.paged_mqa_logits(*sample.args)
        fmt = mqa_checks.check_cache(mqa_checks.PAGED, cache, mqa_checks.head_dim(q), ascend, q)
        qd, kd, ks, ke = portable.paged_as_ragged(q, q_sf, cache, fmt, table, lens, torch.float32)
        ragged = tam.mqa_logits(qd, kd, w, ks.int(), ke.int(), max_seqlen_k=max_len, logits_dtype=out.dtype)
        assert _finite_diff(out, ragged.double()) < 1e-12, sample.name


def test_paged_gradients():
    sample = T.paged_samples("cpu", torch.float64, requires_grad=True, small=True)[0]
    q, w = sample.args[0], sample.args[3]
    out = torch.ops.ascend_moe.paged_mqa_logits(*sample.args)
    gq, gw = torch.autograd.grad(out.sum(), (q, w))
    lens = sample.args[4].flatten().tolist()
    qr = q.detach().reshape(len(lens), q.shape[2], q.shape[3]).requires_grad_()
    wr = w.detach().clone().requires_grad_()
    ref = sum(
        torch.einsum("hj,h->j", torch.einsum("hd,jd->hj", qr[r], sample.kv_values[r][:n]).relu(), wr[r]).sum()
        for r, n in enumerate(lens)
    )
    rq, rw = torch.autograd.grad(ref, (qr, wr))
    rq = rq.view(q.shape)
    assert calc_diff(gq, rq) < 1e-12 and calc_diff(gw, rw) < 1e-12


def test_compressed_rows_equal_full_rows_and_topk_agrees():
    q, k, w, ks, ke = _inputs(64, 16, 64, 300, "cp", seed=5)
    ks = ks + torch.randint(0, 20, ks.shape, dtype=torch.int32).clamp(max=ke - ks)
    full = tam.mqa_logits(q.float(), k.float(), w, ks, ke)
    width = int((ke - ks).max())
    comp = tam.mqa_logits(q.float(), k.float(), w, ks, ke, max_seqlen_k=width)
    for i in range(64):
        a, b = int(ks[i]), int(ke[i])
        assert torch.equal(comp[i, : b - a], full[i, a:b]) and comp[i, b - a :].isneginf().all()
    vf, idx_full = tam.mqa_topk(full, ks, ke, 32)
    vc, idx_comp = tam.mqa_topk(comp, ks, ke, 32, compressed=True)
    assert torch.equal(idx_full, idx_comp) and torch.equal(vf, vc)
    inside = (idx_full >= ks[:, None]) & (idx_full < ke[:, None])
    assert torch.equal(inside, idx_full >= 0)  # every index is inside its query's range, or -1 padding
    assert torch.equal(idx_full >= 0, (torch.arange(32) < (ke - ks)[:, None]))


def test_topk_gradient_lands_on_selected_logits():
    logits = torch.randn(4, 20, dtype=torch.float64, requires_grad=True)
    ks, ke = torch.tensor([0, 3, 5, 0], dtype=torch.int32), torch.tensor([20, 9, 6, 0], dtype=torch.int32)
    values, idx = tam.mqa_topk(logits, ks, ke, 4)
    (g,) = torch.autograd.grad(values.masked_fill(values.isinf(), 0).sum(), (logits,))
    expected = torch.zeros_like(logits)
    for i, j in (idx >= 0).nonzero().tolist():
        expected[i, idx[i, j]] = 1
    assert torch.equal(g, expected)


def test_metadata_splits_work_evenly():
    lens = torch.tensor([[100, 1000], [50, 2000], [0, 0], [300, 300]], dtype=torch.int32)
    meta = tam.paged_mqa_logits_metadata(lens, 64, 4)
    assert meta.shape == (5, 2) and meta.dtype == torch.int32
    # units per request: ceil(1000/256)=4, 8, 0, 2 -> 14 units over 4 SMs: starts 0, 4, 8, 11
    assert meta.tolist() == [[0, 0], [1, 0], [1, 4], [1, 7], [4, 0]]


@settings(max_examples=25, deadline=None)
@given(
    s=st.integers(0, 40),
    h=st.sampled_from([1, 3, 8, 64]),
    d=st.sampled_from([32, 64]),
    s_kv=st.integers(1, 700),
    seed=st.integers(0, 2**16),
    compressed=st.booleans(),
)
def test_random_shapes_cpp_vs_portable(s, h, d, s_kv, seed, compressed):
    g = torch.Generator().manual_seed(seed)
    q, k, w = torch.randn(s, h, d, generator=g), torch.randn(s_kv, d, generator=g), torch.rand(s, h, generator=g)
    ks, ke = T.random_ranges(s, s_kv, g)
    width = max(1, int((ke - ks).max())) if compressed and s else 0
    out = tam.mqa_logits(q, k, w, ks, ke, max_seqlen_k=width)
    ref = portable.mqa_logits(q, None, k, None, w, ks, ke, width)
    assert _finite_diff(out, ref.double()) < 1e-10
    assert _finite_diff(out, T.mqa_logits_reference(q, None, k, None, w, ks, ke, width, None)) < 1e-10


@pytest.mark.parametrize("compressed", [False, True])
def test_mqa_logits_backward_op_masks_and_partial_outputs(compressed):
    """``ascend_moe::mqa_logits_backward`` called directly: each requested output equals the full call's; a NaN
    in a KV row reaches the weight gradients of exactly the queries whose logits hold that row, and no other key's
    gradient, the same in the C++ and the portable kernel."""
    g = torch.Generator().manual_seed(11)
    s, h, d, s_kv = 9, 4, 32, 40
    q, k, w = torch.randn(s, h, d, generator=g), torch.randn(s_kv, d, generator=g), torch.randn(s, h, generator=g)
    ks = torch.randint(0, 20, (s,), generator=g, dtype=torch.int32)
    ke = (ks + torch.randint(1, 15, (s,), generator=g, dtype=torch.int32)).clamp(max=s_kv)
    ks[0], ke[0] = 30, 35  # query 0 never sees KV row 0
    max_seqlen = int((ke - ks).max()) if compressed else 0
    grad = torch.randn(s, max_seqlen or s_kv, generator=g)
    op = torch.ops.ascend_moe.mqa_logits_backward
    full = op(grad, q, None, k, None, w, ks, ke, max_seqlen, [True, True, True])
    for i in range(3):
        mask = [j == i for j in range(3)]
        assert torch.equal(op(grad, q, None, k, None, w, ks, ke, max_seqlen, mask)[i], full[i])
    k_nan = k.clone()
    k_nan[0, 0] = float("nan")
    sees_row0 = (ks <= 0) & (ke > 0)
    for kernel in (op, portable.mqa_logits_backward):
        _, dk, dw = kernel(grad, q, None, k_nan, None, w, ks, ke, max_seqlen, [True, True, True])
        assert torch.equal(dw.isnan().any(-1), sees_row0), "a NaN KV row reaches the weights of its queries only"
        assert not dk[1:].isnan().any(), "a NaN KV row reaches its own key gradient only"
