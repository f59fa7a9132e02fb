"""``flash_mla.flash_attn_varlen_func`` and its packed forms (FlashMLA's dense MHA prefill, §6) against an fp64
loop over queries written from the spec: varlen batches, causal masks aligned bottom-right (s_q > s_k leaves
early queries with no key: out 0, lse +inf), grouped-query heads, the packed splits, upstream's lse strides,
gradients (fp64 gradcheck) and the refused arguments."""

from __future__ import annotations

import math

import pytest
import torch

import torch_ascend_moe.flash_mla as flash_mla
from torch_ascend_moe.testing import calc_diff


def _reference(q, k, v, cu_q, cu_k, scale, causal):
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    lse = torch.full((q.shape[0], q.shape[1]), math.inf, dtype=torch.float64)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        s_q, s_k = q1 - q0, k1 - k0
        for r in range(s_q):
            visible = [c for c in range(s_k) if not causal or c <= s_k - s_q + r]
            if not visible:
                continue
            for h in range(q.shape[1]):
                keys, values = k[k0:k1, h // group].double()[visible], v[k0:k1, h // group].double()[visible]
                logits = scale * keys @ q[q0 + r, h].double()
                lse[q0 + r, h] = torch.logsumexp(logits, 0)
                out[q0 + r, h] = torch.softmax(logits, 0) @ values
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(("h_q", "h_kv"), [(4, 4), (6, 2)])
def test_values(causal, h_q, h_kv):
    g = torch.Generator().manual_seed(h_q + causal)
    lens_q, lens_k = [5, 1, 0, 9], [3, 4, 2, 9]  # s_q > s_k: early causal queries see nothing
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), h_q, 24, generator=g).bfloat16()
    k = torch.randn(int(cu_k[-1]), h_kv, 24, generator=g).bfloat16()
    v = torch.randn(int(cu_k[-1]), h_kv, 16, generator=g).bfloat16()
    out, lse = flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 9, softmax_scale=0.3, causal=causal)
    want_out, want_lse = _reference(q, k, v, cu_q, cu_k, 0.3, causal)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert lse.shape == (q.shape[0], h_q) and lse.stride() == (1, q.shape[0])  # upstream allocates [h, total].T
    assert torch.equal(lse.isinf(), want_lse.isinf())
    assert calc_diff(out, want_out) < 1e-5
    finite = want_lse.isfinite()
    torch.testing.assert_close(lse[finite].double(), want_lse[finite], rtol=1e-5, atol=1e-5)
    if causal:
        assert torch.equal(out[0], torch.zeros_like(out[0])) and lse[0].isposinf().all()


def test_packed_forms_split_like_upstream():
    g = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 4, 11], dtype=torch.int32)
    qkv = torch.randn(11, 2, 3 * 8, generator=g)
    want = flash_mla.flash_attn_varlen_func(qkv[..., :8], qkv[..., 8:16], qkv[..., 16:], cu, cu, 7, 7, causal=True)
    got = flash_mla.flash_attn_varlen_qkvpacked_func(qkv, cu, 7, 8, causal=True)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    got = flash_mla.flash_attn_varlen_kvpacked_func(qkv[..., :8], qkv[..., 8:], cu, cu, 7, 7, 8, causal=True)
    for a, b in zip(got, want):
        assert torch.equal(a, b)


def test_gradients():
    g = torch.Generator().manual_seed(2)
    cu_q, cu_k = torch.tensor([0, 3, 5], dtype=torch.int32), torch.tensor([0, 2, 6], dtype=torch.int32)
    q = torch.randn(5, 4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(6, 2, 6, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(6, 2, 5, generator=g, dtype=torch.float64, requires_grad=True)

    def fn(q, k, v):
        return flash_mla.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 3, 4, causal=False)[0]

    assert torch.autograd.gradcheck(fn, (q, k, v))


def test_refused_arguments():
    q, cu = torch.randn(4, 2, 8), torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(AssertionError, match="argument 'dropout_p'"):  # upstream's asserts
        flash_mla.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, dropout_p=0.1)
    with pytest.raises(AssertionError, match="argument 'deterministic'"):
        flash_mla.flash_attn_varlen_func(q, q, q, cu, cu, 4, 4, deterministic=True)
    with pytest.raises(ValueError, match="argument 'k': expected a head count dividing h_q = 2"):
        flash_mla.flash_attn_varlen_func(q, torch.randn(4, 3, 8), torch.randn(4, 3, 8), cu, cu, 4, 4)


def test_fixed_length_batches():
    """``is_varlen=False`` (upstream's fixed-length kernel, which its own test passes for equal lengths): the same
    result when every sequence has the max lengths; refused when they do not."""
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(6, 2, 8, generator=g), torch.randn(8, 2, 8, generator=g)
    cu_q, cu_k = torch.tensor([0, 3, 6], dtype=torch.int32), torch.tensor([0, 4, 8], dtype=torch.int32)
    fixed = flash_mla.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 4, causal=True, is_varlen=False)
    varlen = flash_mla.flash_attn_varlen_func(q, k, k, cu_q, cu_k, 3, 4, causal=True)
    for a, b in zip(fixed, varlen):
        assert torch.equal(a, b)
    uneven = torch.tensor([0, 2, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="argument 'is_varlen': expected True unless every sequence has max_seqlen"):
        flash_mla.flash_attn_varlen_func(q, k, k, uneven, cu_k, 4, 4, is_varlen=False)
