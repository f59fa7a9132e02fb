"""The norm family beyond the harness: results bit for bit in the spec's operation order on random shapes, dtypes
and special values (hypothesis); autograd against autograd of the formula; TileKernels' (Ascend era) norm kernels
through the compat package: out-parameters, the cast's layouts, 3-D inputs, the weight-gradient accumulation."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import torch_ascend_moe as tam
import torch_ascend_moe.tile_kernels as tile_kernels
from tests.norm.specs import quant_reference
from tests.quant.test_tile_kernels_casts import _expected_sf
from torch_ascend_moe.tile_kernels.testing.numeric import assert_equal

quant = tile_kernels.quant


def _spec_order(x, weight, eps, residual, out_scale):
    """``(out, rstd, s)`` in the spec's FP32 operation order."""
    s = x if residual is None else (x + residual).to(x.dtype)
    sf = s.float()
    rstd = (sf.square().sum(-1) / x.shape[-1] + eps).rsqrt()
    out = (sf * rstd[..., None] * ((1.0 if weight is None else weight.float()) * out_scale)).to(x.dtype)
    return out, rstd, s


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.sampled_from([[1, 16], [9, 64], [2, 5, 128], [3, 1, 7, 32], [0, 32]]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    weighted=st.booleans(),
    with_residual=st.booleans(),
    out_scale=st.sampled_from([1.0, 0.37, 3.0]),
    specials=st.booleans(),
)
def test_bitwise_in_the_spec_order(seed, shape, dtype, weighted, with_residual, out_scale, specials):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * 3
    if specials and x.numel():
        x.view(-1)[torch.randint(0, x.numel(), (4,), generator=g)] = torch.tensor(
            [float("nan"), float("inf"), 1e30, 0.0]
        )
    x = x.to(dtype)
    w = torch.randn(shape[-1], generator=g).to(dtype) if weighted else None
    r = torch.randn(shape, generator=g).to(dtype) if with_residual else None
    out, rstd, s = tam.rms_norm(x, w, 1e-5, residual=r, out_scale=out_scale)
    want = _spec_order(x, w, 1e-5, r, out_scale)
    torch.testing.assert_close(out, want[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(rstd, want[1], rtol=0, atol=0, equal_nan=True)
    if r is None:
        assert s.numel() == 0
    else:
        torch.testing.assert_close(s, want[2], rtol=0, atol=0, equal_nan=True)
    data, sf, out2, _, _ = tam.rms_norm_quant(x, w, 1e-5, residual=r, out_scale=out_scale, num_per_channels=16)
    ref = quant_reference(x, w, 1e-5, r, out_scale, 16, False)
    # Codes equal; a NaN's sign carries nothing (the reference converts through FP64).
    torch.testing.assert_close(data.float(), ref[0].float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(sf, ref[1].float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(out2, out, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("with_residual", [True, False])
def test_autograd_matches_the_formula(weighted, with_residual):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 3, 32, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(32, generator=g, dtype=torch.float64, requires_grad=True) if weighted else None
    r = torch.randn(6, 3, 32, generator=g, dtype=torch.float64, requires_grad=True) if with_residual else None
    go, gs = (
        torch.randn(6, 3, 32, generator=g, dtype=torch.float64),
        torch.randn(6, 3, 32, generator=g, dtype=torch.float64),
    )
    inputs = [t for t in (x, w, r) if t is not None]
    out, _, s = tam.rms_norm(x, w, 1e-6, residual=r, out_scale=0.5)
    loss = (out * go).sum() + ((s * gs).sum() if with_residual else 0)
    s_ref = x if r is None else x + r
    ref = s_ref * torch.rsqrt(s_ref.square().mean(-1, keepdim=True) + 1e-6) * ((1.0 if w is None else w) * 0.5)
    loss_ref = (ref * go).sum() + ((s_ref * gs).sum() if with_residual else 0)
    for got, want in zip(torch.autograd.grad(loss, inputs), torch.autograd.grad(loss_ref, inputs)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_compat_norm_forward_and_buffers():
    g = torch.Generator().manual_seed(3)
    x, r = torch.randn(33, 256, generator=g).bfloat16(), torch.randn(33, 256, generator=g).bfloat16()
    w = torch.randn(256, generator=g).bfloat16()
    out, rstd, norm_input = quant.norm_forward(x, w, 1e-6)
    assert norm_input is x  # upstream's alias without a residual
    want = _spec_order(x, w, 1e-6, None, 1.0)
    assert_equal(out, want[0]) and assert_equal(rstd, want[1])
    buf, res_buf = torch.empty_like(x), torch.empty_like(x)
    out, rstd, norm_input = quant.norm_forward(x, w, 1e-6, residual=r, out_scale=2.0, out=buf, residual_out=res_buf)
    want = _spec_order(x, w, 1e-6, r, 2.0)
    assert out is buf and norm_input is res_buf
    assert_equal(out, want[0]) and assert_equal(norm_input, want[2])
    with pytest.raises(AssertionError):
        quant.norm_forward(x[:, :250], None, 1e-6)  # upstream's CUDA limit: hidden % 16


@pytest.mark.parametrize("layout", [(False, True, False), (True, True, True), (False, False, False)], ids=str)
@pytest.mark.parametrize("batched", [False, True])
def test_compat_norm_forward_and_per_token_cast(layout, batched):
    col_major, round_sf, packed = layout
    g = torch.Generator().manual_seed(4)
    shape = [2, 17, 128] if batched else [33, 128]
    x, r = torch.randn(shape, generator=g).bfloat16(), torch.randn(shape, generator=g).bfloat16()
    w = torch.randn(128, generator=g).bfloat16()
    (data, sf), bf16, rstd, norm_input = quant.norm_forward_and_per_token_cast(
        x, w, 1e-6, "e4m3", 32, residual=r, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
        use_packed_ue8m0=packed, with_out_bf16=True,
    )  # fmt: skip
    ref_data, ref_sf, out, ref_rstd, s = quant_reference(x, w, 1e-6, r, 1.0, 32, round_sf)
    assert torch.equal(data.view(torch.uint8), ref_data.to(torch.float8_e4m3fn).view(torch.uint8))
    expected = [_expected_sf(part.float(), col_major, packed) for part in (ref_sf if batched else [ref_sf])]
    assert torch.equal(sf, torch.stack(expected) if batched else expected[0])
    assert_equal(bf16, _spec_order(x, w, 1e-6, r, 1.0)[0]) and torch.equal(rstd, _spec_order(x, w, 1e-6, r, 1.0)[1])
    assert_equal(norm_input, s.bfloat16())


@pytest.mark.parametrize("tokens", [0, 5, 300, 512])
def test_mega_moe_sf_rows(tokens):
    """``mega_moe_sf`` as the Ascend-era fork's test checks it: a column-major int32 buffer of ``ceil(T / m) *
    align(m, 128)`` rows (-1 filled), passed as its first T rows; token t's packed UE8M0 codes land at
    ``t // m * align(m, 128) + i // 128 * 128 + i % 32 * 4 + i % 128 // 32`` (``i = t % m``, m = 192), every other
    row stays -1; the usual outputs are unchanged."""
    hidden, m = 256, 192
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(4)).bfloat16()
    rows = -(-tokens // m) * 256
    buffer = torch.full((hidden // 128, rows), -1, dtype=torch.int32).mT
    kwargs = dict(round_sf=True, use_tma_aligned_col_major_sf=True, use_packed_ue8m0=True)
    got = quant.norm_forward_and_per_token_cast(x, None, 1e-6, "e4m3", 32, mega_moe_sf=buffer[:tokens],
                                                mega_moe_block_m=m, **kwargs)  # fmt: skip
    plain = quant.norm_forward_and_per_token_cast(x, None, 1e-6, "e4m3", 32, **kwargs)
    assert torch.equal(got[0][0].view(torch.uint8), plain[0][0].view(torch.uint8)) and torch.equal(
        got[0][1], plain[0][1]
    )
    normalized = quant.norm_forward(x, None, 1e-6)[0]
    sf = quant.per_token_cast(normalized, "e4m3", 32, round_sf=True)[1]  # FP32 powers of two [T, H / 32]
    codes = ((sf.view(torch.int32) >> 23) & 0xFF).to(torch.uint8).view(torch.int32)  # 4 codes a word
    want = torch.full_like(buffer, -1)
    for t in range(tokens):
        i = t % m
        want[t // m * 256 + i // 128 * 128 + i % 32 * 4 + i % 128 // 32] = codes[t]
    assert torch.equal(buffer, want)


@pytest.mark.parametrize(
    "t, h, dtype, npc",
    [
        (0, 512, torch.bfloat16, 128),
        (17, 512, torch.bfloat16, 128),
        (17, 512, torch.float32, 128),
        (17, 512, torch.float32, 512),
        (17, 640, torch.bfloat16, 128),
        (17, 7168, torch.bfloat16, 128),
    ],
    ids=str,
)
@pytest.mark.parametrize("layout", [(False, False, False), (False, True, False), (True, True, True)], ids=str)
def test_compat_rmsnorm_forward_and_per_token_cast(t, h, dtype, npc, layout):
    """TileKernels' fused RMSNorm + per-token cast (9375f83): the normalized row kept in FP32, cast as
    ``per_token_cast`` casts. Upstream's test and tolerances: against the cast of an exact RMSNorm, at most
    ``max(1, numel/1000)`` FP8 codes apart (the reduction order at a rounding boundary), FP32 scales to 2e-6, packed
    scales equal; upstream's cases and flag sets. Rounding the row to x's dtype first (what
    ``norm_forward_and_per_token_cast`` casts) moves far more codes than that for BF16 x."""
    col_major, round_sf, packed = layout
    if col_major and npc != 128:
        pytest.skip("column-major scales only with 128 channels per block (upstream's assert)")
    g = torch.Generator().manual_seed(t + h + npc)
    x, w = torch.randn(t, h, generator=g).to(dtype), torch.randn(h, generator=g).to(dtype)
    kw = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
    data, sf = quant.rmsnorm_forward_and_per_token_cast(x, w, 1e-6, "e4m3", npc, **kw)
    exact = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    want_data, want_sf = quant.per_token_cast(exact.float(), "e4m3", npc, **kw)
    codes = data.view(torch.uint8) != want_data.view(torch.uint8)
    assert int(codes.sum()) <= max(1, data.numel() // 1000), int(codes.sum())
    if sf.dtype == torch.float32:
        torch.testing.assert_close(sf, want_sf, rtol=2e-6, atol=0)
    else:
        assert torch.equal(sf, want_sf)
    if dtype == torch.bfloat16 and t:  # the fused kernel does not round the row to BF16 before the cast
        rounded, _ = quant.per_token_cast(exact.bfloat16(), "e4m3", npc, **kw)
        assert int((rounded.view(torch.uint8) != want_data.view(torch.uint8)).sum()) > max(1, data.numel() // 1000)


def test_compat_norm_backward_accumulates():
    g = torch.Generator().manual_seed(5)
    x, go = torch.randn(20, 64, generator=g), torch.randn(20, 64, generator=g)
    w = torch.randn(64, generator=g)
    _, rstd, _ = quant.norm_forward(x, w, 1e-6)
    x_grad, w_grad = quant.norm_backward(go, x, w, rstd, out_scale=1.5)
    ref_x, ref_w = tile_kernels.torch.norm_backward_ref(go, x, w, rstd, out_scale=1.5)
    assert_equal(x_grad, ref_x) and assert_equal(w_grad, ref_w)
    acc = torch.ones(64)
    result = quant.norm_backward(go, x, w, rstd, out_scale=1.5, weight_grad=acc)[1]
    assert result is acc and torch.equal(acc, (1 + ref_w).float())
    xr = x.double().requires_grad_()
    y = xr * torch.rsqrt(xr.square().mean(-1, keepdim=True) + 1e-6) * w.double() * 1.5
    torch.testing.assert_close(x_grad.double(), torch.autograd.grad(y, xr, go.double())[0], rtol=1e-5, atol=1e-5)


_PORTABLE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == torch.float8_e4m3fn:  # a NaN code's sign is open (IEEE leaves a NaN result's sign unspecified)
        ua, ub = a.view(torch.uint8), b.view(torch.uint8)
        return torch.equal(torch.where(ua & 0x7F == 0x7F, 0x7F, ua), torch.where(ub & 0x7F == 0x7F, 0x7F, ub))
    same = (a == b) | (a.isnan() & b.isnan())
    return a.shape == b.shape and a.dtype == b.dtype and a.stride() == b.stride() and bool(same.all())


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.sampled_from([(9,), (3, 4, 40), (300, 1000), (1, 40000)]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.float64]),
    weighted=st.booleans(),
    residual=st.booleans(),
    out_scale=st.sampled_from([1.0, 0.3]),
    transposed=st.booleans(),
    npc=st.sampled_from([32, 128]),
    round_sf=st.booleans(),
)
def test_cpu_kernels_equal_the_portable_kernels(
    seed, shape, dtype, weighted, residual, out_scale, transposed, npc, round_sf
):
    """The C++ kernels (chunks of rows, several threads on the bigger shapes; ATen's row and column sums) compute
    the portable kernels' operations in their order: every output bit for bit, NaN/inf rows and strided inputs
    included."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    x.view(-1)[torch.randint(0, x.numel(), (2,), generator=g)] = torch.tensor([float("nan"), float("inf")]).to(dtype)
    if transposed and x.dim() >= 2:
        x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
    w = (torch.rand(shape[-1], generator=g) + 0.5).to(dtype) if weighted else None
    r = torch.randn(*shape, generator=g).to(dtype) if residual else None
    ops = torch.ops.ascend_moe
    args = (x, w, 1e-6, r, out_scale)
    for got, want in zip(ops.rms_norm.default(*args), ops.rms_norm.default.redispatch(_PORTABLE, *args)):
        assert _same(got, want)
    if dtype != torch.float64:
        quant_args = (*args, npc, round_sf)
        fq = ops.rms_norm_quant.default
        for got, want in zip(fq(*quant_args), fq.redispatch(_PORTABLE, *quant_args)):
            assert _same(got, want)
    out, rstd, residual_out = ops.rms_norm(*args)
    grad = torch.randn(*shape, generator=g).to(dtype)
    residual_grad = torch.randn(*shape, generator=g).to(dtype) if residual else None
    back = (grad, residual_out if residual else x, w, rstd, residual_grad, out_scale)
    fb = ops.rms_norm_backward.default
    for got, want in zip(fb(*back), fb.redispatch(_PORTABLE, *back)):
        assert _same(got, want)
