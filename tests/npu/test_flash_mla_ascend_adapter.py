"""The sparse_mla kernels of FlashMLA's G3 release (backends/upstream/flash_mla.py), on the Ascend chain and on the
CUDA one (SM100). No Ascend or SM100 GPU here: a
stand-in ``flash_mla`` library on the CPU has the release's op signatures (its ``sparse_prefill.cpp`` /
``sparse_decode.cpp`` @ 136b361) and checks (BF16, d 512, h_q 64, V4.1 records, FP4 only as the extra cache; and,
as its decode kernel reads any positive index, no index but -1 may be invalid), and computes upstream's reference
math (the specs' fp64 references, rounded as the kernels return them). The adapters are called directly with CPU
tensors, as ``npu_kernel`` documents."""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch

from tests.chains import chosen
from tests.sparse_mla.specs import decode_reference, make_indices, paged_scope, reference
from torch_ascend_moe.backends import chain
from torch_ascend_moe.backends.upstream import flash_mla as adapter
from torch_ascend_moe.testing import calc_diff

_LIB = torch.library.Library("flash_mla", "FRAGMENT")
CALLS: list[tuple] = []


def _prefill_standin(q, kv, indices, sm_scale, d_v, attn_sink, topk_length):
    assert q.dtype == torch.bfloat16 and q.shape[2] == 512 and d_v == 512 and q.shape[1] in (64, 128)
    assert ((indices >= -1) & (indices < kv.shape[0])).all(), "an invalid index other than -1 reached the kernel"
    CALLS.append(("prefill", indices.clone()))
    out, max_logits, lse = reference(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    return [out.to(q.dtype), max_logits.float(), lse.float()]


def _decode_standin(
    q, kv, indices, topk_length, attn_sink, meta, splits, extra_kv, extra_idx, extra_len, d_v, scale, inv
):
    assert q.dtype == torch.bfloat16 and q.shape[3] == 512 and d_v == 512 and q.shape[2] in (64, 128)
    assert kv.shape[3] == 528, "the fp4 KV cache is only supported as extra_kv"
    assert meta is None and splits is None and not inv
    for cache, idx in ((kv, indices), (extra_kv, extra_idx)):
        if cache is not None:
            assert cache.shape[3] in (528, 288) and cache.stride(1) == cache.shape[3]
            total = cache.shape[0] * cache.shape[1]
            assert ((idx == -1) | ((idx >= 0) & (idx < total))).all(), "the kernel would read out of bounds"
    CALLS.append(("decode", indices.clone()))
    out, lse = decode_reference(q, kv, indices, scale, d_v, attn_sink, topk_length, extra_kv, extra_idx, extra_len)
    return out.to(q.dtype), lse.float().transpose(1, 2).contiguous(), None, None


_LIB.define(
    "sparse_prefill_fwd(Tensor q, Tensor kv, Tensor indices, float sm_scale, int d_v, Tensor? attn_sink, "
    "Tensor? topk_length) -> Tensor[]"
)
_LIB.define(
    "sparse_decode_fwd(Tensor q, Tensor kv, Tensor indices, Tensor? topk_length, Tensor? attn_sink, "
    "Tensor? tile_scheduler_metadata, Tensor? num_splits, Tensor? extra_kv, Tensor? extra_indices, "
    "Tensor? extra_topk_length, int d_v, float sm_scale, bool enable_batch_invariant) -> (Tensor, Tensor, Tensor?, "
    "Tensor?)"
)
_LIB.impl("sparse_prefill_fwd", _prefill_standin, "CPU")
_LIB.impl("sparse_decode_fwd", _decode_standin, "CPU")


@pytest.fixture(autouse=True)
def _fresh_calls():
    CALLS.clear()


@pytest.fixture(params=["npu", "cuda"])
def device(request, monkeypatch):
    """The chain the adapters sit in: Ascend's, or CUDA's on an SM100 GPU (what ``sm_major`` would answer there);
    our Triton prefill switched off, so a refused call reaches the portable kernel on both."""
    if request.param == "cuda":
        monkeypatch.setattr(adapter, "sm_major", lambda t: adapter.SM100)
    with chain.disabled("triton"):
        yield request.param


def _prefill_args(h_q=64, d=512, topk=64, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(h_q + d + topk)
    s_q, s_kv = 6, 90
    q = (torch.randn(s_q, h_q, d, generator=g) / 3).to(dtype)
    kv = (torch.randn(s_kv, 1, d, generator=g) / 3).to(dtype)
    sink = torch.randn(h_q, generator=g)
    sink[0] = math.inf
    lengths = torch.tensor([topk, 0, 5, topk, 17, 40], dtype=torch.int32)
    return q, kv, make_indices(s_q, s_kv, topk, g), 0.5, d, sink, lengths


@pytest.mark.parametrize("heads", [64, 128])
def test_prefill_reaches_the_release_with_only_minus_one_invalid(device, heads):
    args = _prefill_args(h_q=heads)
    if device == "npu" and heads == 128:  # the Ascend kernels declare HEAD_64 only
        assert chosen("sparse_mla_prefill", device, *args) == "portable"
        return
    out, max_logits, lse = chain.run("sparse_mla_prefill", device, *args)
    want = torch.ops.ascend_moe.sparse_mla_prefill(*args)
    assert [c[0] for c in CALLS] == ["prefill"]
    sent, idx, lengths = CALLS[0][1], args[2], args[6]
    past = torch.arange(idx.shape[-1]) >= lengths.view(-1, 1, 1)  # never read by ours: -1 (upstream's NaN caveat)
    assert torch.equal(sent, torch.where((idx < 0) | (idx >= 90) | past, -1, idx))
    assert calc_diff(out, want[0]) < 1e-5
    for a, b in ((max_logits, want[1]), (lse, want[2])):
        assert torch.equal(a.isinf(), b.isinf()) and torch.allclose(a[a.isfinite()], b[b.isfinite()], atol=1e-4)


@pytest.mark.parametrize(
    "args",
    [_prefill_args(h_q=16), _prefill_args(d=576), _prefill_args(topk=50), _prefill_args(dtype=torch.float32)],
    ids=["h_q 16", "d 576", "topk 50", "fp32"],
)
def test_prefill_outside_the_release_stays_portable(device, args):
    assert chosen("sparse_mla_prefill", device, *args) == "portable"
    chain.run("sparse_mla_prefill", device, *args)
    assert not CALLS


def _decode_args(size=528, extra=288, h_q=64, topk=64):
    g = torch.Generator().manual_seed(size + h_q + topk)
    lens = (70, 0, 33)
    k_cache, indices = paged_scope(lens, 2, topk, 5, size, g)
    d = 576 if size == 656 else 512
    q = torch.randn(3, 2, h_q, d, generator=g).clamp(-1, 1).bfloat16()
    sink = torch.randn(h_q, generator=g)
    lengths = torch.tensor([topk, 3, 20], dtype=torch.int32)
    args = (q, k_cache, indices, d**-0.55, 512, sink, lengths)
    if extra is None:
        return args
    e_cache, e_indices = paged_scope((12, 40, 0), 2, 64, 3, extra, g)
    return args + (e_cache, e_indices, torch.tensor([64, 0, 9], dtype=torch.int32))


@pytest.mark.parametrize("extra", [288, 528, None])
def test_decode_reaches_the_release(device, extra):
    args = _decode_args(extra=extra)
    out, lse = chain.run("sparse_mla_decode", device, *args)
    want_out, want_lse = torch.ops.ascend_moe.sparse_mla_decode(*args)
    assert [c[0] for c in CALLS] == ["decode"]
    assert lse.shape == want_lse.shape and lse.is_contiguous()
    assert calc_diff(out, want_out) < 1e-5
    assert torch.equal(lse.isposinf(), want_lse.isposinf())
    torch.testing.assert_close(lse[lse.isfinite()], want_lse[want_lse.isfinite()], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "args",
    [_decode_args(size=656, extra=None), _decode_args(size=584, extra=None), _decode_args(size=288, extra=None),
     _decode_args(h_q=16), _decode_args(topk=48)],
    ids=["V3.2 records", "V4 records", "FP4 main cache", "h_q 16", "topk 48"],
)  # fmt: skip
def test_decode_outside_the_release_stays_portable(device, args):
    assert chosen("sparse_mla_decode", device, *args) == "portable"
    chain.run("sparse_mla_decode", device, *args)
    assert not CALLS


def test_a_build_with_another_signature_is_not_used():
    with mock.patch.dict(adapter._ARITY, {"sparse_prefill_fwd": 8}):
        assert adapter.flash_mla_op("sparse_prefill_fwd") is None
    assert adapter.flash_mla_op("sparse_prefill_fwd") is not None


def test_cuda_takes_sm100_only(monkeypatch):
    """The release's CUDA kernels are SM100f's: an SM90 GPU's call goes on to our Triton prefill."""
    monkeypatch.setattr(adapter, "sm_major", lambda t: 9)
    args = _prefill_args()
    step = chain.explain("sparse_mla_prefill", "cuda", *args)[0]
    assert step.kernel.library == "flash_mla" and step.status == "refused"
    assert chosen("sparse_mla_prefill", "cuda", *args) == "triton: _sparse_mla"
