"""rotary_embedding beyond the harness: the in-place compat ``tile_kernels.transform.apply_rotary`` (query and key,
3-D with positions, 4-D without), ``tile_kernels.torch.rotary_embedding_ref`` with partial rotary dims, the
conjugate as the inverse, and autograd (the inverse rotation) against autograd of the formula."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

import torch_ascend_moe as tam
import torch_ascend_moe.tile_kernels as tile_kernels
from tests.rope.specs import reference


def _cache(rows: int, rot: int, seed: int) -> torch.Tensor:
    angle = torch.rand(rows, rot // 2, generator=torch.Generator().manual_seed(seed)) * 6.3
    return torch.cat([angle.cos(), angle.sin()], 1)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_apply_rotary_in_place(interleaved, dtype):
    g = torch.Generator().manual_seed(1)
    cache = _cache(64, 128, 2)
    q, k = torch.randn(10, 4, 128, generator=g).to(dtype), torch.randn(10, 1, 128, generator=g).to(dtype)
    positions = torch.randint(0, 60, (10,), generator=g, dtype=torch.int32)
    q0, k0 = q.clone(), k.clone()
    tile_kernels.transform.apply_rotary(q, cache, k, positions, interleaved=interleaved, seqlen_offset=2)
    for got, x in ((q, q0), (k, k0)):
        want = reference(x, cache, positions, 2, interleaved, False)
        assert (got.double() - want).abs().max() <= 1e-5 + (0.02 if dtype == torch.bfloat16 else 0) * want.abs().max()
    # 4-D without positions: row = offset + index in the sequence; the conjugate undoes the rotation.
    x = torch.randn(2, 6, 3, 64, generator=g)
    y = x.clone()
    cache64 = _cache(16, 64, 3)
    tile_kernels.transform.apply_rotary(y, cache64, seqlen_offset=4, interleaved=interleaved)
    torch.testing.assert_close(y.double(), reference(x, cache64, None, 4, interleaved, False), rtol=0, atol=2e-6)
    tile_kernels.transform.apply_rotary(y, cache64, seqlen_offset=4, interleaved=interleaved, conjugate=True)
    torch.testing.assert_close(y, x, rtol=0, atol=2e-6)
    with pytest.raises(AssertionError):
        tile_kernels.transform.apply_rotary(torch.randn(4, 2, 32), _cache(8, 32, 1))  # upstream: rot 64 or 128


def test_reference_partial_rotary():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 2, 96, generator=g)
    cache = _cache(8, 64, 5)
    cos, sin = cache[:, :32], cache[:, 32:]
    pos = torch.tensor([0, 7, 3, 3, 1])
    out = tile_kernels.torch.rotary_embedding_ref(x, cos, sin, pos, interleaved=True)
    assert torch.equal(out[..., 64:], x[..., 64:])
    torch.testing.assert_close(out[..., :64].double(), reference(x[..., :64], cache, pos, 0, True, False), rtol=0,
                               atol=2e-6)  # fmt: skip


@pytest.mark.parametrize("interleaved", [False, True])
def test_autograd_is_the_inverse_rotation(interleaved):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 5, 3, 16, generator=g, dtype=torch.float64, requires_grad=True)
    angle = torch.rand(9, 8, generator=g, dtype=torch.float64) * 6.3
    cache = torch.cat([angle.cos(), angle.sin()], 1)
    positions = torch.randint(0, 9, (2, 5), generator=g)
    out = tam.rotary_embedding(x, cache, positions, interleaved=interleaved)
    go = torch.randn_like(out)
    got = torch.autograd.grad(out, x, go)[0]
    cos, sin = angle.cos()[positions][..., None, :], angle.sin()[positions][..., None, :]
    x1, x2 = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :8], x[..., 8:])
    y1, y2 = x1 * cos - x2 * sin, x1 * sin + x2 * cos
    ref = torch.stack([y1, y2], -1).flatten(-2) if interleaved else torch.cat([y1, y2], -1)
    torch.testing.assert_close(out, ref, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(got, torch.autograd.grad(ref, x, go)[0], rtol=1e-13, atol=1e-13)


_PORTABLE = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    shape=st.sampled_from([(5, 3, 8), (2, 7, 4, 64), (200, 16, 128), (0, 2, 8), (3, 0, 8)]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.float64]),
    positions=st.booleans(),
    offset=st.sampled_from([0, 3]),
    interleaved=st.booleans(),
    conjugate=st.booleans(),
    strided=st.booleans(),
)
def test_cpu_kernel_equals_the_portable_kernel(seed, shape, dtype, positions, offset, interleaved, conjugate, strided):
    """The C++ kernel (cache rows read in place, tokens over threads) computes the portable kernel's operations in
    its order: bit for bit, NaN/inf and strided inputs, empty token and head dims included."""
    g = torch.Generator().manual_seed(seed)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    rot = shape[-1]
    angle = torch.rand(400, rot // 2, generator=g, dtype=torch.float64) * 6.3
    cache = torch.cat([angle.cos(), angle.sin()], 1).to(acc)
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    if x.numel() > 10:
        x.view(-1)[torch.randint(0, x.numel(), (2,), generator=g)] = torch.tensor([float("nan"), float("inf")]).to(
            dtype
        )
    if strided:
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    pos = torch.randint(0, 390, shape[:-2], generator=g) if positions else None
    op = torch.ops.ascend_moe.rotary_embedding.default
    args = (x, cache, pos, offset, interleaved, conjugate)
    got, want = op(*args), op.redispatch(_PORTABLE, *args)
    assert got.shape == want.shape and got.stride() == want.stride()
    assert bool(((got == want) | (got.isnan() & want.isnan())).all())
