"""``mqa_logits_topk`` (the indexer's logits fused with their top-k) beyond the harness: bitwise the composition
``mqa_topk(mqa_logits(...))`` in the C++ and the portable kernel over random shapes, ranges, operand formats,
logits dtypes and NaNs; gradients equal the composition's; and the memory it holds is a query tile's, never
``[S, S_kv]``."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import assume, given, settings

import torch_ascend_moe as tam
from tests.mqa_logits import specs as T
from torch_ascend_moe.backends.portable import mqa_logits as portable


def _composition(q, q_sf, k, k_sf, w, ks, ke, topk, logits_dtype, portable_kernels=False):
    """``mqa_topk(mqa_logits(...))`` through the C++ kernels (or the portable ones: their FP32 sums are in another
    order than the C++ GEMMs', so each fused kernel is compared with its own composition)."""
    if portable_kernels:
        logits = portable.mqa_logits(q, q_sf, k, k_sf, w, ks, ke, 0, logits_dtype)
        return portable.mqa_topk(logits, ks, ke, topk, False)
    logits = torch.ops.ascend_moe.mqa_logits(q, q_sf, k, k_sf, w, ks, ke, 0, logits_dtype)
    return torch.ops.ascend_moe.mqa_topk(logits, ks, ke, topk)


def _same(a, b) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and torch.equal(a.isnan(), b.isnan())
        and torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
    )


@settings(max_examples=40, deadline=None)
@given(
    s=st.integers(0, 70),
    h=st.sampled_from([1, 3, 8, 64]),
    d=st.sampled_from([32, 64]),
    s_kv=st.integers(1, 1100),
    topk=st.sampled_from([1, 5, 64, 600]),
    fmt=st.sampled_from(["bf16", "fp32", "fp8", "fp4", "fp8-32"]),
    bf16_logits=st.booleans(),
    nan=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_bitwise_the_composition(s, h, d, s_kv, topk, fmt, bf16_logits, nan, seed):
    assume(s > 0 or fmt in ("bf16", "fp32"))  # the test's quantizers take no empty tensors
    g = torch.Generator().manual_seed(seed)
    q_hp, k_hp = torch.randn(s, h, d, generator=g), torch.randn(s_kv, d, generator=g)
    if nan and s:
        q_hp[int(torch.randint(0, s, (1,), generator=g)), 0, 0] = float("nan")
    w = torch.randn(s, h, generator=g)
    if fmt in ("bf16", "fp32"):
        dtype = torch.bfloat16 if fmt == "bf16" else torch.float32
        q, q_sf, k, k_sf = q_hp.to(dtype), None, k_hp.to(dtype), None
        w = w.to(dtype) if fmt == "bf16" else w
    else:
        (q, q_sf), (k, k_sf) = T.quantize(q_hp, "fp8" if fmt == "fp8" else fmt), T.quantize(k_hp, fmt)
    logits_dtype = torch.bfloat16 if (bf16_logits or w.dtype == torch.bfloat16) else None
    ks, ke = T.random_ranges(s, s_kv, g)
    for kernel in (torch.ops.ascend_moe.mqa_logits_topk, portable.mqa_logits_topk):
        want = _composition(q, q_sf, k, k_sf, w, ks, ke, topk, logits_dtype, kernel is portable.mqa_logits_topk)
        got = kernel(q, q_sf, k, k_sf, w, ks, ke, topk, logits_dtype)
        assert _same(got[0], want[0]) and torch.equal(got[1], want[1]), kernel


@pytest.mark.parametrize("pattern", ["causal", "cp"])
def test_deepgemm_shapes_bitwise_the_composition(pattern):
    """DeepGEMM's range patterns at a size where tiles and KV chunks cross their boundaries (512-key chunks)."""
    s, h, d, s_kv, topk = 128, 32, 64, 1536, 256
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(s, h, d, generator=g).bfloat16(), torch.randn(s_kv, d, generator=g).bfloat16()
    w = torch.randn(s, h, generator=g)
    ks, ke = T.causal_ranges(s, s_kv) if pattern == "causal" else T.context_parallel_ranges(s, s_kv)
    values, indices = tam.mqa_logits_topk(q, k, w, ks, ke, topk)
    want = tam.mqa_topk(tam.mqa_logits(q, k, w, ks, ke), ks, ke, topk)
    assert torch.equal(values, want[0]) and torch.equal(indices, want[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradients_equal_the_composition(dtype):
    """The sparse backward (scores recomputed on the selected keys) equals autograd through the composition."""
    g = torch.Generator().manual_seed(5)
    s, h, d, s_kv, topk = 12, 4, 32, 50, 9
    q = torch.randn(s, h, d, generator=g, dtype=dtype).requires_grad_()
    k = torch.randn(s_kv, d, generator=g, dtype=dtype).requires_grad_()
    w = torch.randn(s, h, generator=g, dtype=dtype).requires_grad_()
    ks, ke = T.random_ranges(s, s_kv, g)
    ke[0] = ks[0]  # a query with no keys: all padding
    grad = torch.randn(s, topk, generator=g, dtype=dtype)
    values, _ = tam.mqa_logits_topk(q, k, w, ks, ke, topk)
    fused = torch.autograd.grad(values, (q, k, w), torch.where(values.isfinite(), grad, 0))
    values2, _ = tam.mqa_topk(tam.mqa_logits(q, k, w, ks, ke), ks, ke, topk)
    composed = torch.autograd.grad(values2, (q, k, w), torch.where(values2.isfinite(), grad, 0))
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    for a, b in zip(fused, composed, strict=True):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_quantized_operands_give_weight_gradients_only():
    g = torch.Generator().manual_seed(6)
    (q, q_sf), (k, k_sf) = (
        T.quantize(torch.randn(6, 4, 64, generator=g), "fp8"),
        T.quantize(torch.randn(20, 64, generator=g), "fp8-row"),
    )
    w = torch.rand(6, 4, generator=g).requires_grad_()
    ks, ke = torch.zeros(6, dtype=torch.int32), torch.full((6,), 20, dtype=torch.int32)
    values, _ = tam.mqa_logits_topk(q, k, w, ks, ke, 4, q_sf=q_sf, k_sf=k_sf)
    (dw,) = torch.autograd.grad(values.sum(), (w,))
    logits = tam.mqa_logits(q, k, w, ks, ke, q_sf=q_sf, k_sf=k_sf)
    (dw2,) = torch.autograd.grad(tam.mqa_topk(logits, ks, ke, 4)[0].sum(), (w,))
    torch.testing.assert_close(dw, dw2)


def _largest_allocation(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0), default=0)


@pytest.mark.parametrize("kernel", ["cpp", "portable"])
def test_never_holds_the_full_logits(kernel, monkeypatch):
    """The C++ kernel's largest allocation is a query tile's, the portable one's a block of queries' logits; the
    composition allocates ``[S, S_kv]`` FP32 logits (64 MB here)."""
    s, h, d, s_kv, topk = 1024, 8, 32, 16384, 64
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(s, h, d, generator=g).bfloat16(), torch.randn(s_kv, d, generator=g).bfloat16()
    w = torch.rand(s, h, generator=g)
    ks, ke = T.causal_ranges(s, s_kv)
    logits_bytes = s * s_kv * 4
    if kernel == "cpp":
        biggest = _largest_allocation(lambda: tam.mqa_logits_topk(q, k, w, ks, ke, topk))
    else:
        monkeypatch.setattr(portable, "_SCORE_ELEMENTS", 1 << 20)  # blocks of 64 queries here
        biggest = _largest_allocation(lambda: portable.mqa_logits_topk(q, None, k, None, w, ks, ke, topk, None))
    composed = _largest_allocation(lambda: tam.mqa_topk(tam.mqa_logits(q, k, w, ks, ke), ks, ke, topk))
    assert composed >= logits_bytes
    # C++: a tile's buffer; portable: a 64-query block's logits and its sort keys (FP64 values, int64 order).
    assert biggest <= logits_bytes // (8 if kernel == "cpp" else 4), f"{kernel}: {biggest} bytes in one allocation"
