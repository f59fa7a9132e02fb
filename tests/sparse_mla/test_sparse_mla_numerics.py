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
from tests.sparse_mla.specs import WRITERS, decode_reference, make_indices, reference
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
    """A cache in the ``size``-byte record format written by the independent builders (unused bytes NaN), indices
    through it with -1 padding, as upstream's decode tests build them."""
    g = torch.Generator().manual_seed(seed)
    d_qk = 576 if size == 656 else 512
    values = (torch.randn(sum(lens), d_qk, generator=g) / 10).clamp(-1, 1)
    k_cache, record, _ = WRITERS[size](values, page, g)
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


def _upstream_sink(h_q: int) -> torch.Tensor:
    sink = torch.randn(h_q, generator=torch.Generator().manual_seed(6))
    sink[0], sink[1] = math.inf, -math.inf
    return sink


@pytest.mark.parametrize("size", [656, 584, 528])
def test_decode_upstream_thresholds_and_compat(size):
    """FlashMLA's decode test rule (out abs 1e-3 / rel 2.01/128 / cos 5e-6, lse abs 1e-6 / rel 8.01/65536) against the
    fp64 reference, through the compat entry point as vLLM calls it (keywords, get_mla_metadata() object)."""
    q, k_cache, indices = _decode_case(size=size)
    scale = q.shape[-1] ** -0.55
    sink = _upstream_sink(64)
    meta, _ = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(
        q=q, k_cache=k_cache, block_table=None, cache_seqlens=None, head_dim_v=512,
        tile_scheduler_metadata=meta, softmax_scale=scale, is_fp8_kvcache=True, indices=indices, attn_sink=sink,
    )  # fmt: skip
    want_out, want_lse = decode_reference(q, k_cache, indices, scale, 512, sink, None)
    _upstream_close(out, want_out, 1e-3, 2.01 / 128, 5e-6)
    _upstream_close(lse, want_lse, 1e-6, 8.01 / 65536)
    assert out.shape == (3, 2, 64, 512) and lse.shape == (3, 64, 2) and lse.is_contiguous()
    assert torch.equal(out[1], torch.zeros_like(out[1])) and lse[1].isposinf().all()  # an empty request
    assert meta.have_initialized and meta.config.topk == 64 and meta.config.extra_topk is None
    with pytest.raises(AssertionError, match=r"sched_meta.config.b is 3, this call has 1.*inconsistent"):
        flash_mla.flash_mla_with_kvcache(
            q[:1], k_cache, None, None, 512, meta, is_fp8_kvcache=True, indices=indices[:1]
        )
    with pytest.raises(AssertionError, match="is_fp8_kvcache must be True"):
        flash_mla.flash_mla_with_kvcache(
            q, k_cache, None, None, 512, flash_mla.get_mla_metadata()[0], is_fp8_kvcache=False, indices=indices
        )
    with pytest.raises(AssertionError, match="block_table and cache_seqlens must be provided"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, flash_mla.get_mla_metadata()[0])


def test_decode_g3_call_form_and_edge_cases():
    """G3's call (``is_fp8_kvcache`` left out: True with indices; ``enable_batch_invariant``) equals G2's; a batch of
    0 and a cache of 0 blocks give empty / masked results; a call failing upstream's asserts records no schedule
    (a corrected retry on the same object runs); a q of the wrong rank is an argument error."""
    q, k_cache, indices = _decode_case(size=528)
    g2 = flash_mla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, flash_mla.get_mla_metadata()[0], is_fp8_kvcache=True, indices=indices
    )
    meta = flash_mla.get_mla_metadata()[0]
    g3 = flash_mla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, meta, indices=indices, enable_batch_invariant=True
    )
    assert torch.equal(g2[0], g3[0]) and torch.equal(g2[1], g3[1])
    assert meta.config.is_fp8_kvcache and meta.config.enable_batch_invariant
    out, lse = flash_mla.flash_mla_with_kvcache(q[:0], k_cache, None, None, 512, flash_mla.get_mla_metadata()[0],
                                                indices=indices[:0])  # fmt: skip
    assert out.shape == (0, 2, 64, 512) and lse.shape == (0, 64, 2)
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache[:0], None, None, 512, flash_mla.get_mla_metadata()[0],
                                                indices=torch.full_like(indices, -1))  # fmt: skip
    assert torch.equal(out, torch.zeros_like(out)) and lse.isposinf().all()
    meta = flash_mla.get_mla_metadata()[0]
    with pytest.raises(AssertionError, match="causal must be False"):
        flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, causal=True, indices=indices)
    assert not meta.have_initialized
    assert torch.equal(flash_mla.flash_mla_with_kvcache(q, k_cache, None, None, 512, meta, indices=indices)[0], g2[0])
    with pytest.raises(ValueError, match="flash_mla.flash_mla_with_kvcache: argument 'q' rank: expected 4, got 3"):
        flash_mla.flash_mla_with_kvcache(
            q[0], k_cache, None, None, 512, flash_mla.get_mla_metadata()[0], indices=indices
        )


@pytest.mark.parametrize(("size", "extra_size"), [(584, 584), (528, 288), (528, 528)])
def test_decode_extra_cache_upstream_thresholds(size, extra_size):
    """DeepSeek-V4's two KV scopes in one softmax, called positionally as upstream's test harness does
    (``lib.run_flash_mla_decode``), with per-request topk lengths for both scopes and sinks: upstream's thresholds
    against the fp64 reference; the extra scope changes the result (it is not ignored)."""
    q, k_cache, indices = _decode_case(h_q=16, topk=64, page=5, lens=(40, 0, 70, 9), s_q=3, seed=8, size=size)
    _, extra, extra_indices = _decode_case(h_q=16, topk=32, page=3, lens=(30, 12, 0, 9), s_q=3, seed=9, size=extra_size)
    lengths = torch.tensor([64, 10, 0, 5], dtype=torch.int32)
    extra_lengths = torch.tensor([32, 0, 7, 32], dtype=torch.int32)
    scale, sink = 512**-0.55, _upstream_sink(16)
    meta, splits = flash_mla.get_mla_metadata()
    args = (q, k_cache, None, None, 512, meta, splits, scale, False, True, indices, sink, extra, extra_indices)
    out, lse = flash_mla.flash_mla_with_kvcache(*args, lengths, extra_lengths)
    want_out, want_lse = decode_reference(
        q, k_cache, indices, scale, 512, sink, lengths, extra, extra_indices, extra_lengths
    )
    _upstream_close(out, want_out, 1e-3, 2.01 / 128, 5e-6)
    _upstream_close(lse, want_lse, 1e-6, 8.01 / 65536)
    assert lse[2].isposinf().all() and torch.equal(out[2], torch.zeros_like(out[2]))  # nothing in either scope
    assert meta.config.extra_topk == 32 and meta.config.extra_page_block_size == 3
    alone, _ = sparse_mla_decode(q, k_cache, indices, scale, 512, sink, lengths)
    assert not torch.equal(alone[0], out[0])
    with pytest.raises(AssertionError, match="extra_topk"):
        flash_mla.flash_mla_with_kvcache(*args[:-1], extra_indices[..., :16], lengths, extra_lengths)


def _dense_reference(q, blocked_k, block_table, seqlens, d_v, causal, scale):
    """Upstream's dense decode reference, in fp64: per request its first ``seqlens[b]`` tokens through the block
    table, GQA by head groups, a causal mask bottom-right aligned; a query seeing nothing: out 0, lse +inf."""
    b, s_q, h_q, d = q.shape
    page, h_kv = blocked_k.shape[1], blocked_k.shape[2]
    out = torch.zeros(b, s_q, h_q, d_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64)
    for i in range(b):
        n = int(seqlens[i])
        kv = blocked_k[block_table[i, : -(-n // page)].long()].reshape(-1, h_kv, d)[:n].double()
        kv = kv.repeat_interleave(h_q // h_kv, dim=1).transpose(0, 1)  # [h_q, n, d]
        scores = scale * q[i].double().transpose(0, 1) @ kv.transpose(1, 2)  # [h_q, s_q, n]
        if causal:
            scores = scores.masked_fill(torch.ones(s_q, n, dtype=torch.bool).tril(n - s_q).logical_not(), -math.inf)
        row_lse = torch.logsumexp(scores, dim=-1)
        seen = row_lse.isfinite()
        out[i] = torch.where(seen[..., None], torch.softmax(scores, dim=-1) @ kv[..., :d_v], 0).transpose(0, 1)
        lse[i] = torch.where(seen, row_lse, math.inf)
    return out, lse


@pytest.mark.parametrize(("h_q", "h_kv", "s_q", "causal", "dtype"), [
    (16, 1, 1, False, torch.bfloat16), (9, 3, 4, True, torch.bfloat16), (8, 2, 2, True, torch.float16),
    (6, 1, 3, False, torch.float16),
])  # fmt: skip
def test_dense_decode_against_upstreams_reference(h_q, h_kv, s_q, causal, dtype):
    """The dense mode as upstream's dense decode test builds it: random lengths (one empty, one shorter than s_q),
    permuted blocks, NaN in every slot past a length and 2147480000 in unused block-table slots (never read);
    upstream's thresholds (out abs 8e-4 / rel 2.01/128 / cos 5e-6, lse abs 1e-6 / rel 8.01/65536)."""
    g = torch.Generator().manual_seed(h_q * 7 + s_q)
    b, page, d, d_v = 4, 16, 576, 512
    seqlens = torch.tensor([70, 0, 2, 33], dtype=torch.int32)
    per = 5
    block_table = torch.randperm(b * per, generator=g).to(torch.int32).view(b, per)
    blocked_k = (torch.randn(b * per, page, h_kv, d, generator=g) / 10).clamp(-1, 1).to(dtype)
    for i in range(b):
        n, used = int(seqlens[i]), -(-int(seqlens[i]) // page)
        blocked_k[block_table[i, used:].long()] = math.nan
        if n % page:
            blocked_k[int(block_table[i, used - 1]), n % page :] = math.nan
        block_table[i, used:] = 2147480000
    q = (torch.randn(b, s_q, h_q, d, generator=g) / 10).clamp(-1, 1).to(dtype)
    meta, splits = flash_mla.get_mla_metadata()
    out, lse = flash_mla.flash_mla_with_kvcache(q, blocked_k, block_table, seqlens, d_v, meta, splits, causal=causal)
    want_out, want_lse = _dense_reference(q, blocked_k, block_table, seqlens, d_v, causal, d**-0.5)
    assert out.dtype == dtype and lse.shape == (b, h_q, s_q) and lse.is_contiguous()
    _upstream_close(out, want_out, 8e-4, 2.01 / 128, 5e-6)
    _upstream_close(lse, want_lse, 1e-6, 8.01 / 65536)
    assert lse[1].isposinf().all()  # an empty cache


def test_dense_decode_gradients_and_compile():
    """The dense mode is the prefill op's composition: fp64 gradcheck through q and the cache, and one
    ``torch.compile(fullgraph=True)`` graph (no host read of the lengths while compiling)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 2, 4, 12, generator=g, dtype=torch.float64, requires_grad=True)
    k_cache = torch.randn(6, 4, 2, 12, generator=g, dtype=torch.float64, requires_grad=True)
    table = torch.tensor([[3, 0, 5], [1, 2, 4]], dtype=torch.int32)
    lens = torch.tensor([9, 2], dtype=torch.int32)

    def run(q, k_cache):
        return flash_mla.flash_mla_with_kvcache(
            q, k_cache, table, lens, 8, flash_mla.get_mla_metadata()[0], causal=True
        )

    torch.autograd.gradcheck(lambda q, k: run(q, k)[0], (q, k_cache))
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    for a, b in zip(compiled(q, k_cache), run(q, k_cache)):
        torch.testing.assert_close(a, b)


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
