"""sparse_mla_prefill beyond the harness: upstream FlashMLA's comparison rule and thresholds on its head shapes
(BF16, d_qk 576 and 512, h_q 64 and 128, scaled-down s_q / s_kv), the exact semantics of sinks (+-inf),
``topk_length`` and invalid indices, NaN in rows nobody selects, memory O(s_q * topk), gradients of BF16 inputs
against the fp64 ones, and the ``flash_mla`` compat functions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_ascend_moe.flash_mla as flash_mla
from tests.sparse_mla.specs import decode_reference, make_indices, reference, write_v32_cache, write_v41_cache
from torch_ascend_moe.backends.portable import sparse_mla as portable
from torch_ascend_moe.bench import peak_memory_mb
from torch_ascend_moe.ops.sparse_mla import sparse_mla_decode, sparse_mla_prefill
from torch_ascend_moe.testing import calc_diff


def _upstream_close(got, ref, abs_tol, rel_tol, cos_tol=1.0) -> None:
    """FlashMLA's tests/kernelkit/compare.py: +-inf and NaN at the same positions; every other element within
    ``abs_tol`` or ``rel_tol`` (abs / (|ref| + 1e-6)); then calc_diff <= ``cos_tol`` (skipped for a ~zero ref)."""
    got, ref = got.double(), ref.double()
    for special in (torch.isnan, torch.isposinf, torch.isneginf):
        assert torch.equal(special(got), special(ref))
    finite = torch.isfinite(ref)
    err = (got[finite] - ref[finite]).abs()
    assert ((err < abs_tol) | (err / (ref[finite].abs() + 1e-6) < rel_tol)).all(), err.max()
    if ref[finite].square().sum() >= 1e-12:
        assert calc_diff(got[finite], ref[finite]) <= cos_tol


def _inputs(s_q, h_q, d_qk, s_kv, topk, seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q = (torch.randn(s_q, h_q, d_qk, generator=g) / 10 + torch.randn(1, generator=g) / 10).clamp(-10, 10)
    kv = (torch.randn(s_kv, 1, d_qk, generator=g) / 10 + torch.randn(1, generator=g) / 10).clamp(-10, 10)
    return q.to(dtype), kv.to(dtype), make_indices(s_q, s_kv, topk, g)


@pytest.mark.parametrize(("d_qk", "h_q"), [(576, 128), (512, 64)])
@pytest.mark.parametrize(("s_kv", "topk"), [(128, 128), (592, 128), (95, 128), (153, 256)])
def test_upstream_thresholds(d_qk, h_q, s_kv, topk):
    q, kv, indices = _inputs(9, h_q, d_qk, s_kv, topk, seed=s_kv)
    g = torch.Generator().manual_seed(topk)
    sink = torch.randn(h_q, generator=g)
    sink[:3] = torch.tensor([math.inf, -math.inf, math.inf])
    length = torch.randint(0, topk + 1, (9,), generator=g, dtype=torch.int32)
    out, max_logits, lse = sparse_mla_prefill(q, kv, indices, 0.5, 512, sink, length)
    ref = reference(q, kv, indices, 0.5, 512, sink, length)  # upstream compares with an FP32 reference
    _upstream_close(out, ref[0], 8e-4, 3.01 / 128, 7e-6)
    _upstream_close(max_logits, ref[1], 1e-6, 2.01 / 65536)
    _upstream_close(lse, ref[2], 1e-6, 2.01 / 65536)


def test_sinks_and_lengths_are_exact():
    q, kv, indices = _inputs(7, 4, 64, 50, 32, dtype=torch.float32)
    plain = sparse_mla_prefill(q, kv, indices, 0.3, 64)
    minus = sparse_mla_prefill(q, kv, indices, 0.3, 64, torch.full((4,), -math.inf))
    plus = sparse_mla_prefill(q, kv, indices, 0.3, 64, torch.full((4,), math.inf))
    for a, b in zip(plain, minus):
        assert torch.equal(a, b)  # a -inf sink changes nothing
    assert torch.equal(plus[0], torch.zeros_like(plus[0]))  # a +inf sink takes all the weight
    assert torch.equal(plus[1], plain[1]) and torch.equal(plus[2], plain[2])  # and never touches the stats
    length = torch.tensor([0, 1, 5, 32, 40, 17, 3], dtype=torch.int32)
    cut = indices.clone()
    for i, n in enumerate(length.tolist()):
        cut[i, 0, n:] = -1
    for a, b in zip(sparse_mla_prefill(q, kv, indices, 0.3, 64, None, length), sparse_mla_prefill(q, kv, cut, 0.3, 64)):
        assert torch.equal(a, b)
    out, max_logits, lse = sparse_mla_prefill(q, kv, indices, 0.3, 64, None, length)
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # a token with no row
    assert torch.isposinf(lse[0]).all() and torch.isneginf(max_logits[0]).all()


def test_rows_nobody_selects_may_hold_nan():
    q, kv, indices = _inputs(6, 2, 32, 40, 16, dtype=torch.float32)
    length = torch.full((6,), 10, dtype=torch.int32)
    want = sparse_mla_prefill(q, kv, indices, 0.5, 32, None, length)
    selected = {int(i) for row in indices[:, 0, :10].tolist() for i in row if 0 <= i < 40}
    poisoned = kv.clone()
    poisoned[[i for i in range(40) if i not in selected]] = math.nan
    got = sparse_mla_prefill(q, poisoned, indices, 0.5, 32, None, length)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_memory_is_per_selected_row():
    """s_q 2048 x s_kv 65536 logits would be 512 MB in FP32; the op holds what its chunk of queries selects."""
    q, kv, _ = _inputs(2048, 4, 64, 65536, 1, dtype=torch.float32)
    indices = torch.randint(0, 65536, (2048, 1, 64), generator=torch.Generator().manual_seed(1), dtype=torch.int32)
    peak = peak_memory_mb(lambda: sparse_mla_prefill(q, kv, indices, 0.125, 64))
    if peak is None:
        pytest.skip("the kernel does not let the peak-RSS counter be reset")
    assert peak < 96, peak


def test_bf16_gradients_against_fp64():
    q, kv, indices = _inputs(8, 4, 48, 30, 24)
    sink = torch.randn(4, generator=torch.Generator().manual_seed(3))
    grads = {}
    for dtype in (torch.bfloat16, torch.float64):
        qd = q.detach().to(dtype).requires_grad_()
        kvd = kv.detach().to(dtype).requires_grad_()
        sd = sink.detach().to(torch.float64 if dtype == torch.float64 else torch.float32).requires_grad_()
        out, _, lse = sparse_mla_prefill(qd, kvd, indices, 0.4, 32, sd)
        w = torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        ((out.double() * w).sum() + torch.where(lse.isinf(), 0, lse.double()).sum()).backward()
        grads[dtype] = (qd.grad, kvd.grad, sd.grad)
    for got, want in zip(grads[torch.bfloat16], grads[torch.float64]):
        assert calc_diff(got, want) < 1e-4


def test_flash_mla_compat():
    q, kv, indices = _inputs(5, 64, 576, 70, 128)
    sink = torch.randn(64)
    got = flash_mla.flash_mla_sparse_fwd(q, kv, indices, 576**-0.5, d_v=512, attn_sink=sink)
    want = sparse_mla_prefill(q, kv, indices, 576**-0.5, 512, sink)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    assert got[0].dtype == torch.bfloat16 and got[1].dtype == got[2].dtype == torch.float32
    meta, none = flash_mla.get_mla_metadata()
    assert isinstance(meta, flash_mla.FlashMLASchedMeta) and none is None and not meta.have_initialized
    meta, _ = flash_mla.get_mla_metadata(torch.tensor([5], dtype=torch.int32), 64, 1, 64, True, 128)  # G1 form
    assert isinstance(meta, flash_mla.FlashMLASchedMeta)


@settings(max_examples=40, deadline=None)
@given(
    s_q=st.integers(0, 9),
    h_q=st.integers(1, 5),
    d_qk=st.integers(1, 40),
    s_kv=st.integers(1, 30),
    topk=st.integers(0, 24),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32, torch.float64]),
    sink=st.booleans(),
    length=st.booleans(),
    strided=st.booleans(),
    nan=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cpu_kernel_agrees_with_the_portable_one(s_q, h_q, d_qk, s_kv, topk, dtype, sink, length, strided, nan, seed):
    """Random shapes, dtypes, strides, sinks (+-inf included), lengths (negative and past topk included), NaN in a
    row: the C++ kernel and the portable one give the same non-finite entries and values to rounding."""
    g = torch.Generator().manual_seed(seed)
    d_v = int(torch.randint(1, d_qk + 1, (1,), generator=g))
    q = torch.randn(s_q, h_q, d_qk, generator=g).to(dtype)
    kv = torch.randn(s_kv, 1, d_qk, generator=g).to(dtype)
    if strided:  # other strides: q's heads and kv's rows transposed in memory
        q = q.transpose(0, 1).contiguous().transpose(0, 1)
        kv = kv.transpose(0, 2).contiguous().transpose(0, 2)
    if nan and s_kv > 1:
        kv[1, 0, 0] = math.nan
    indices = make_indices(s_q, s_kv, topk, g) if topk else torch.zeros(s_q, 1, 0, dtype=torch.int32)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    attn_sink = torch.randn(h_q, generator=g).to(acc) if sink else None
    if sink:
        attn_sink[0] = [math.inf, -math.inf, 0.5][seed % 3]
    topk_length = torch.randint(-2, topk + 3, (s_q,), generator=g, dtype=torch.int32) if length else None
    args = (q, kv, indices, 0.7, d_v, attn_sink, topk_length)
    got = torch.ops.ascend_moe.sparse_mla_prefill(*args)
    want = portable.sparse_mla_prefill(*args)
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        a, b = a.double(), b.double()
        for special in (torch.isnan, torch.isposinf, torch.isneginf):
            assert torch.equal(special(a), special(b))
        finite = a.isfinite() & b.isfinite()
        tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5, torch.float64: 1e-12}[dtype]
        torch.testing.assert_close(a[finite], b[finite], rtol=tol, atol=tol)


def _decode_case(h_q=64, topk=64, page=61, lens=(150, 0, 90), s_q=2, seed=5, size=656):
    """A V3.2 (656) or V4.1 (528) cache written by the independent builders (unused bytes NaN), indices through it
    with -1 padding."""
    g = torch.Generator().manual_seed(seed)
    d_qk = 576 if size == 656 else 512
    values = (torch.randn(sum(lens), d_qk, generator=g) / 10).clamp(-1, 1)
    k_cache, record, _ = (write_v32_cache if size == 656 else write_v41_cache)(values, page, g)
    b = len(lens)
    indices = torch.full((b, s_q, topk), -1, dtype=torch.int32)
    start = 0
    for r, n in enumerate(lens):
        for s in range(s_q):
            if n:
                picks = torch.randperm(n, generator=g)[: min(n, topk)]
                indices[r, s, : len(picks)] = record[start + picks].to(torch.int32)
        start += n
    q = torch.randn(b, s_q, h_q, d_qk, generator=g).clamp(-1, 1).bfloat16()
    return q, k_cache, indices


@pytest.mark.parametrize("size", [656, 528])
def test_decode_upstream_thresholds_and_compat(size):
    """FlashMLA's decode test rule (out abs 1e-3 / rel 2.01/128 / cos 5e-6, lse abs 1e-6 / rel 8.01/65536) against the
    fp64 reference, through the compat entry point as vLLM calls it (keywords, get_mla_metadata() object)."""
    q, k_cache, indices = _decode_case(size=size)
    scale = q.shape[-1] ** -0.55
    sink = torch.randn(64, generator=torch.Generator().manual_seed(6))
    sink[0] = math.inf
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        q=q, k_cache=k_cache, block_table=None, cache_seqlens=None, head_dim_v=512,
        tile_scheduler_metadata=meta, softmax_scale=scale, is_fp8_kvcache=True, indices=indices, attn_sink=sink,
    )  # fmt: skip
    want_out, want_lse = decode_reference(q, k_cache, indices, scale, 512, sink, None)
    _upstream_close(out, want_out, 1e-3, 2.01 / 128, 5e-6)
    _upstream_close(lse, want_lse, 1e-6, 8.01 / 65536)
    assert out.shape == (3, 2, 64, 512) and lse.shape == (3, 64, 2)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and lse[1].isposinf().all()  # an empty request
    assert meta.have_initialized
    with pytest.raises(AssertionError, match="inconsistent with sched_meta"):
        flash_mla.flash_mla_with_kvcache(
            q[:1], k_cache, None, None, 512, meta, is_fp8_kvcache=True, indices=indices[:1]
        )
    with pytest.raises(NotImplementedError, match="dense decode"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, flash_mla.get_mla_metadata()[0])
    v4 = torch.zeros(*k_cache.shape[:3], 584, dtype=torch.uint8)  # V4's block-major records: not yet
    with pytest.raises(NotImplementedError, match="584-byte"):
        flash_mla.flash_mla_with_kvcache(
            q,
            v4,
            None,
            None,
            512,
            flash_mla.get_mla_metadata()[0],
            is_fp8_kvcache=True,
            indices=indices,
        )


def test_decode_reads_only_selected_records():
    """Records nobody selects hold NaN bytes (the builder's fill); changing them changes nothing, and a selected
    record's bytes do matter."""
    q, k_cache, indices = _decode_case(h_q=4, topk=16, page=5, lens=(30, 12), s_q=1, seed=7)
    want = sparse_mla_decode(q, k_cache, indices, 0.05, 64)
    poked = k_cache.clone()
    selected = set(indices[indices >= 0].tolist())
    for r in range(poked.shape[0] * poked.shape[1]):
        if r not in selected:
            poked[r // poked.shape[1], r % poked.shape[1]] = 0x7F
    for a, b in zip(sparse_mla_decode(q, poked, indices, 0.05, 64), want):
        assert torch.equal(a, b)
    r = int(indices[0, 0, 0])
    poked[r // poked.shape[1], r % poked.shape[1], 0, :512] = 0x40
    assert not torch.equal(sparse_mla_decode(q, poked, indices, 0.05, 64)[0], want[0])
