"""The swiglu family beyond the harness: FP32 results bit for bit in the spec's operation order (TileKernels'
references compare its kernels bitwise) on random shapes, strides, layouts and special values; the exact fused
multiply-add; the clamp counters; autograd through the op against autograd of the formula."""

from __future__ import annotations

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings

import torch_ascend_moe as tam
from tests.swiglu.specs import backward_fp32_x_grad, fma_f32, forward_fp32, layout, layout_mask
from torch_ascend_moe._arith import fma

FP8 = torch.float8_e4m3fn


def e4m3_codes(q: torch.Tensor) -> torch.Tensor:
    """E4M3 codes with both NaN codes (0x7F, 0xFF) read as 0x7F: IEEE 754 leaves the sign of a NaN result of an
    operation on NaN open (x86 returns the first operand's NaN, and compilers swap commutative operands)."""
    u = q.view(torch.uint8)
    return torch.where(u & 0x7F == 0x7F, 0x7F, u)


def test_fma_rounds_once():
    # a·b + c lies just below the midpoint between 1 + 2^-23 and 1 + 2^-22: one rounding gives the lower value,
    # FP64 then FP32 (two roundings) the upper.
    a = torch.tensor([2.0**-24 * (1 + 2.0**-23)])
    b = torch.tensor([1 - 2.0**-23])
    c = 1 + 2.0**-23
    assert float((a.double() * b.double() + c).float()) == 1 + 2.0**-22
    assert float(fma(a, b, c)) == 1 + 2.0**-23 == float(fma_f32(float(a), float(b), c))


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1))
def test_fma_matches_exact_arithmetic(seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(64, generator=g) * 2.0 ** torch.randint(-30, 30, (64,), generator=g)
    b = torch.randn(64, generator=g) * 2.0 ** torch.randint(-30, 30, (64,), generator=g)
    c = torch.randn(64, generator=g) * 2.0 ** torch.randint(-60, 60, (64,), generator=g)
    got = fma(a, b, c)
    want = [fma_f32(x, y, z) for x, y, z in zip(a.tolist(), b.tolist(), c.tolist())]
    assert np.array_equal(got.numpy().view(np.int32), np.array(want, dtype=np.float32).view(np.int32))


def _inputs(draw_seed, rows, h, dtype, specials, strided):
    g = torch.Generator().manual_seed(draw_seed)
    x = torch.randn(rows, 2 * h, generator=g) * 4
    if specials and rows:
        spots = torch.randint(0, rows * 2 * h, (6,), generator=g)
        x.view(-1)[spots] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30, -1e30, 0.0])
    x = x.to(dtype)
    if strided:  # rows read through a wider buffer
        x = torch.cat([x, torch.zeros(rows, 3, dtype=dtype)], 1)[:, : 2 * h]
    return x, g


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(0, 40),
    h=st.sampled_from([8, 32, 96]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    experts=st.integers(0, 5),
    alignment=st.sampled_from([1, 4, 16]),
    weighted=st.booleans(),
    scale=st.sampled_from([None, 2.5]),
    clamp=st.sampled_from([None, 0.5, 10.0]),
    specials=st.booleans(),
    strided=st.booleans(),
)
def test_forward_bitwise(seed, rows, h, dtype, experts, alignment, weighted, scale, clamp, specials, strided):
    x, g = _inputs(seed, rows, h, dtype, specials, strided)
    w = torch.rand(rows, generator=g) if weighted else None
    scale = scale if weighted else None
    psum = layout(rows, experts, alignment, g)
    out, sf, count = tam.swiglu_forward(x, w, psum, alignment=alignment, routed_scaling_factor=scale, clamp_value=clamp)
    want = forward_fp32(x, w, psum, alignment, scale, clamp)
    assert sf.numel() == 0
    torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)
    mask = layout_mask(psum, alignment, rows)
    if clamp is None:
        assert count.tolist() == [0, 0, 0, 0]
    else:
        a, b = x.float()[:, :h][mask], x.float()[:, h:][mask]
        assert count.tolist() == [int((a > clamp).sum()), int((b > clamp).sum()), int((b < -clamp).sum()),
                                  int(mask.sum()) * h]  # fmt: skip
    bf16, _, _ = tam.swiglu_forward(
        x, w, psum, alignment=alignment, routed_scaling_factor=scale, clamp_value=clamp, out_dtype=torch.bfloat16
    )
    torch.testing.assert_close(bf16, want.bfloat16(), rtol=0, atol=0, equal_nan=True)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(0, 24),
    h=st.sampled_from([8, 64]),
    fp8=st.booleans(),
    experts=st.integers(0, 4),
    weighted=st.booleans(),
    clamp=st.sampled_from([None, 0.5, 10.0]),
    specials=st.booleans(),
)
def test_backward_bitwise(seed, rows, h, fp8, experts, weighted, clamp, specials):
    x, g = _inputs(seed, rows, h, torch.float32, specials, False)
    x_sf = None
    if fp8:
        x_sf = torch.rand(rows, 2 * h // 8, generator=g) + 0.5  # arbitrary FP32 scales: the product rounds in FP32
        x = x.clamp(-448, 448).to(FP8)
    grad = torch.randn(rows, h, generator=g)
    w = torch.rand(rows, generator=g) if weighted else None
    scale = 1.5 if weighted else None
    psum = layout(rows, experts, 4, g)
    x_grad, q, sf, w_grad, out = tam.swiglu_backward(
        x, grad, w, psum, x_sf=x_sf, alignment=4, routed_scaling_factor=scale, clamp_value=clamp, num_per_channels=32
    )
    want = backward_fp32_x_grad(x, x_sf, grad, w, psum, 4, scale, clamp)
    torch.testing.assert_close(x_grad, want, rtol=0, atol=0, equal_nan=True)
    fwd = forward_fp32(x if x_sf is None else x.float() * x_sf.repeat_interleave(8, 1), w, psum, 4, scale, clamp)
    torch.testing.assert_close(out, fwd, rtol=0, atol=0, equal_nan=True)
    # The cast is of the FP32 gradient, as a per-token cast of it.
    q_ref, sf_ref = tam.quantize_blocks(want, "e4m3", [1, 32])
    assert torch.equal(e4m3_codes(q), e4m3_codes(q_ref))
    torch.testing.assert_close(sf, sf_ref, rtol=0, atol=0, equal_nan=True)
    assert w_grad.shape == ((rows,) if weighted else (0,))


def test_padding_rows_and_empty_experts():
    x = torch.randn(10, 16)
    w = torch.rand(10)
    # Expert 0: rows 0..2, expert 1 empty (written as its aligned start), expert 2: rows 4..6, rows 3, 7.. padding.
    psum = torch.tensor([3, 4, 7], dtype=torch.int32)
    out, _, count = tam.swiglu_forward(x, w, psum, alignment=4, clamp_value=0.1)
    mask = torch.tensor([1, 1, 1, 0, 1, 1, 1, 0, 0, 0], dtype=torch.bool)
    assert torch.equal(out[~mask], torch.zeros(4, 8)) and bool((out[mask] != 0).any())
    assert int(count[3]) == 6 * 8
    x_grad, _, _, w_grad, _ = tam.swiglu_backward(x, torch.randn(10, 8), w, psum, alignment=4)
    assert torch.equal(x_grad[~mask], torch.zeros(4, 16)) and torch.equal(w_grad[~mask], torch.zeros(4))


def test_forward_e4m3_is_the_per_token_cast_of_the_fp32_result():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(33, 256, generator=g).bfloat16()
    w = torch.rand(33, generator=g)
    for npc, round_sf, floor in [(128, False, None), (32, True, None), (128, True, 0.5)]:
        q, sf, _ = tam.swiglu_forward(
            x, w, clamp_value=10.0, out_dtype=FP8, num_per_channels=npc, round_sf=round_sf, sf_clamp_min=floor
        )
        y = forward_fp32(x, w, None, 1, None, 10.0)
        q_ref, sf_ref = tam.quantize_blocks(y, "e4m3", [1, npc], round_sf=round_sf, amax_clamp=floor or 1e-4)
        assert torch.equal(e4m3_codes(q), e4m3_codes(q_ref)) and torch.equal(sf, sf_ref)


@pytest.mark.parametrize("clamp", [None, 0.7])
def test_autograd_matches_the_formula(clamp):
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(12, 32, generator=g, dtype=torch.float64) * 2).requires_grad_()
    w = torch.rand(12, generator=g, dtype=torch.float64).requires_grad_()
    psum = torch.tensor([5, 5, 11], dtype=torch.int32)
    out, _, _ = tam.swiglu_forward(x, w, psum, alignment=2, routed_scaling_factor=1.5, clamp_value=clamp)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (x, w), grad)
    mask = layout_mask(psum, 2, 12)
    a, b = x[:, :16], x[:, 16:]
    if clamp is not None:
        a, b = a.clamp(max=clamp), b.clamp(-clamp, clamp)
    ref = torch.where(mask[:, None], torch.nn.functional.silu(a) * b * (w * 1.5)[:, None], 0)
    want = torch.autograd.grad(ref, (x, w), grad)
    for a_, b_ in zip(got, want):
        torch.testing.assert_close(a_, b_, rtol=1e-12, atol=1e-12)


def test_quantized_output_is_not_differentiable():
    x = torch.randn(4, 64, requires_grad=True)
    q, sf, count = tam.swiglu_forward(x, out_dtype=FP8, num_per_channels=32)
    assert not q.requires_grad and not sf.requires_grad and not count.requires_grad


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype == FP8:
        return torch.equal(e4m3_codes(a), e4m3_codes(b))
    return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())


_PORTABLE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.sampled_from([1, 5, 300]),
    h=st.sampled_from([3, 64, 1000]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.float64]),
    experts=st.integers(0, 4),
    weighted=st.booleans(),
    clamp=st.sampled_from([None, 2.0]),
    out=st.sampled_from([None, torch.bfloat16, FP8]),
    npc=st.sampled_from([16, 128]),
    round_sf=st.booleans(),
    fp8_x=st.booleans(),
)
def test_cpu_kernels_equal_the_portable_kernels(
    seed, rows, h, dtype, experts, weighted, clamp, out, npc, round_sf, fp8_x
):
    """The C++ kernels (one pass per chunk of rows, several chunks and threads on the bigger shapes) compute the
    portable kernels' operations in their order: every output bit for bit, NaN/inf rows included."""
    x, g = _inputs(seed, rows, h, dtype, True, False)
    w = torch.rand(rows, generator=g) if weighted else None
    scale = 2.5 if weighted else None
    psum = layout(rows, experts, 4, g)
    fwd = torch.ops.ascend_moe.swiglu_forward.default
    args = (x, w, psum, 4, scale, clamp, out, npc, round_sf, None)
    for got, want in zip(fwd(*args), fwd.redispatch(_PORTABLE, *args)):
        assert _same(got, want)
    grad = torch.randn(rows, h, generator=g).to(dtype)
    x_sf = None
    if fp8_x and dtype == torch.float32:
        x_sf = torch.rand(rows, 2 if h % 2 else 2 * h // 16, generator=g) + 0.5
        x = x.clamp(-448, 448).to(FP8)
    bwd = torch.ops.ascend_moe.swiglu_backward.default
    args = (x, x_sf, grad, w, psum, 4, scale, clamp, None, npc if out == FP8 else 0, round_sf)
    for got, want in zip(bwd(*args), bwd.redispatch(_PORTABLE, *args)):
        assert _same(got, want)
