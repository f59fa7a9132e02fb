"""The stand-in ``tile_kernels`` (tests/standins/tile_kernels) against what upstream documents and tests: its casts
equal upstream's reference ``tile_kernels.torch.cast`` bitwise on finite inputs (upstream's test_per_token_cast,
test_per_block_cast, test_per_channel_cast), dequantize within upstream's test bounds, lay their scales out as
upstream allocates them, keep the sf-only / precomputed-sf round trips; the fused SwiGLU kernels equal upstream's
references (test_swiglu_forward_and_per_token_cast bitwise, test_swiglu_backward_and_per_token_cast bitwise and 1e-4
for the weight gradient); the later release's RMSNorm and RoPE follow their docstrings; asserts carry upstream's
file:line and condition; what the real kernels would trap or write garbage on panics; each release has its names.

The references here are written from upstream's ``tile_kernels/torch`` sources independently of the stand-in's
kernels where they differ in form (the backward, the dequantization, the RMSNorm and RoPE formulas)."""

from __future__ import annotations

import pytest
import torch

from tests.upstream.standin import installed
from torch_ascend_moe.testing import calc_diff

FP8 = torch.float8_e4m3fn


@pytest.fixture
def tk():
    with installed("tile_kernels") as library:
        yield library


@pytest.fixture
def later():
    with installed("tile_kernels", version="cd8f86c", arch=10) as library:
        yield library


def _bytes(t):
    return t.contiguous().view(torch.uint8)


def _e2m1_values(packed: torch.Tensor) -> torch.Tensor:
    """Upstream's ``unpack_from_e2m1fn_x2``: low nibble first, s|e(2)|m(1), bias 1."""
    b = packed.view(torch.uint8).to(torch.int32)
    codes = torch.stack([b & 0xF, b >> 4], dim=-1).flatten(-2)
    s, e, m = codes >> 3, (codes >> 1) & 3, (codes & 1).float()
    value = torch.where(e == 0, m * 0.5, (1 + m * 0.5) * torch.pow(2.0, (e - 1).float()))
    return torch.where(s == 1, -value, value)


def _dequantize(data, sf, block) -> torch.Tensor:
    values = _e2m1_values(data) if data.dtype == torch.int8 else data.float()
    scales = sf.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)
    return values * scales[: values.shape[0], : values.shape[1]]


CASTS = [
    ("per_token_cast", (1, 128)),
    ("per_token_cast", (1, 32)),
    ("per_token_cast", (1, 16)),
    ("per_block_cast", (128, 128)),
    ("per_block_cast", (32, 32)),
]


@pytest.mark.parametrize(("name", "block"), CASTS)
@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_casts_are_upstreams_reference_on_finite_inputs(tk, name, block, fmt, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, 192, generator=g).to(dtype)  # ragged rows and (for 128-wide blocks) a ragged last block
    width = block[1] if name == "per_token_cast" else block
    for round_sf in (False, True):
        data, sf = getattr(tk.quant, name)(x, fmt, width, round_sf=round_sf)
        ref_data, ref_sf = tk._ref.cast(x, fmt, block, round_sf=round_sf)
        assert torch.equal(_bytes(data), _bytes(ref_data)) and torch.equal(sf, ref_sf), (name, block, round_sf)
        assert data.dtype == (FP8 if fmt == "e4m3" else torch.int8) and sf.dtype == torch.float32
        bound = 1e-3 if fmt == "e4m3" else 2e-2  # upstream's test_cast_back
        assert calc_diff(_dequantize(data, sf, block), x.float()) < bound
        if round_sf:
            assert bool(((sf.view(torch.int32) & 0x807FFFFF) == 0).all())  # powers of two
        # sf only, then cast with the precomputed sf (multiplier 1 / sf: the same codes for power-of-two scales, the
        # ones upstream's tests use)
        assert torch.equal(getattr(tk.quant, f"{name}_with_sf_only")(x, fmt, width, round_sf=round_sf), sf)
        again = getattr(tk.quant, f"{name}_with_precomputed_sf")(x, fmt, width, sf)
        assert torch.equal(_bytes(again), _bytes(tk._ref.cast(x, fmt, block, sf=sf)))
        assert not round_sf or torch.equal(_bytes(again), _bytes(data))


def test_per_channel_cast_is_the_reference(tk):
    x = torch.randn(256, 192).bfloat16()
    for round_sf in (False, True):
        data, sf = tk.quant.per_channel_cast(x, "e4m3", 128, round_sf)
        ref = tk._ref.cast(x, "e4m3", (128, 1), round_sf=round_sf)
        assert torch.equal(_bytes(data), _bytes(ref[0])) and torch.equal(sf, ref[1]) and sf.shape == (2, 192)
    with pytest.raises(AssertionError, match=r"per_channel_cast_kernel.py:25: assert num_tokens % 128 == 0"):
        tk.quant.per_channel_cast(x[:100], "e4m3", 128)


def test_scale_layouts_are_upstreams(tk):
    """Column-major (rows padded to 4 in the allocation, stride(0) == 1) and packed UE8M0 (four exponent bytes per
    int32, little end first, column-major)."""
    x = torch.randn(6, 640)
    _, row_major = tk.quant.per_token_cast(x, "e4m3", 128, round_sf=True)
    _, col = tk.quant.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True, round_sf=True)
    assert torch.equal(col, row_major) and col.stride() == (1, 8)
    _, packed = tk.quant.per_token_cast(x, "e4m3", 128, use_tma_aligned_col_major_sf=True, round_sf=True,
                                        use_packed_ue8m0=True)  # fmt: skip
    assert packed.dtype == torch.int32 and packed.shape == (6, 2) and packed.stride() == (1, 8)
    exponents = (row_major.view(torch.int32) >> 23).to(torch.uint8)
    unpacked = packed.T.contiguous().view(torch.uint8).view(2, 6, 4).permute(1, 0, 2).reshape(6, 8)[:, :5]
    assert torch.equal(unpacked, exponents)


def test_asserts_carry_upstreams_file_line_and_condition(tk):
    x = torch.randn(4, 256)
    cases = [
        (lambda: tk.quant.per_token_cast(x, "e4m3", 100), r"per_token_cast_kernel.py:182: assert num_per_channels in"),
        (lambda: tk.quant.per_token_cast(x, "e3m2", 128), r"per_token_cast_kernel.py:170"),
        (lambda: tk.quant.per_token_cast(x.half(), "e4m3", 128), r"common.py:87"),
        (lambda: tk.quant.per_token_cast_with_precomputed_sf(x, "e4m3", 256, torch.ones(4, 1)),
         r"per_token_cast_kernel.py:33"),
        (lambda: tk.quant.per_block_cast(x.t(), "e4m3", (128, 128)), r"per_block_cast_kernel.py:159"),
        (lambda: tk.quant.per_block_cast(x, "e4m3", (64, 64)), r"per_block_cast_kernel.py:30"),
        (lambda: tk.quant.swiglu_forward_and_per_token_cast(torch.randn(4, 192), "e4m3", 128),
         r"swiglu_forward_and_per_token_cast_kernel.py:228: assert hidden % 128 == 0"),
        (lambda: tk.quant.swiglu_backward_and_per_token_cast((x.to(FP8), torch.ones(4, 4)), x[:, :128].bfloat16(),
         torch.ones(4, 1), torch.zeros(4, dtype=torch.int32), torch.zeros(4, 1, dtype=torch.int32), 64),
         r"swiglu_backward_and_per_token_cast_kernel.py:188"),
    ]  # fmt: skip
    for call, match in cases:
        with pytest.raises(AssertionError, match=match):
            call()


def test_what_the_kernels_trap_on_or_garble_panics(tk):
    x = torch.randn(8, 256)
    with pytest.raises(tk._standin.Panic, match="columns are not contiguous"):
        tk.quant.per_token_cast(x.t().contiguous().t(), "e4m3", 128)
    with pytest.raises(tk._standin.Panic, match="misaligned"):
        tk.quant.per_token_cast(torch.randn(8 * 256 + 1)[1:].view(8, 256), "e4m3", 128)
    h = torch.randn(4, 256)
    with pytest.raises(tk._standin.Panic, match="never loaded"):  # a weighted row with pos_to_token_topk -1
        tk.quant.swiglu_forward_and_per_token_cast(h, "e4m3", 128, torch.tensor([0, -1, 1, 2], dtype=torch.int32),
                                                   torch.rand(3, 1))  # fmt: skip
    data, x_sf = tk.quant.per_token_cast(torch.randn(4, 512), "e4m3", 128)
    with pytest.raises(tk._standin.Panic, match="grad_out"):  # read as BF16 whatever it is
        tk.quant.swiglu_backward_and_per_token_cast((data, x_sf), torch.randn(4, 256), torch.ones(4, 1),
                                                    torch.arange(4, dtype=torch.int32),
                                                    torch.arange(4, dtype=torch.int32).view(4, 1), 128)  # fmt: skip


def test_the_kernels_amax_differs_from_the_reference_on_non_finite_blocks(tk):
    """A NaN loses the kernel's amax (fmaxf) and an infinite amax with round_sf gives a -inf multiplier; the reference
    (and our op) gives those blocks a NaN / 0 / inf scale and x·0 codes."""
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(7))
    x[0, 5], x[1, 7] = float("nan"), float("inf")
    for round_sf in (False, True):
        data, sf = tk.quant.per_token_cast(x, "e4m3", 128, round_sf=round_sf)
        ref_data, ref_sf = tk._ref.cast(x, "e4m3", (1, 128), round_sf=round_sf)
        without_nan = tk._ref.cast(x[:1].nan_to_num(nan=0.0), "e4m3", (1, 128), round_sf=round_sf)[1]
        assert torch.equal(sf[:1], without_nan)  # the NaN did not count
        assert (ref_sf[0] == 0 if round_sf else ref_sf[0].isnan()).all()
        assert torch.isinf(sf[1]).all() and torch.isinf(ref_sf[1]).all()
        if round_sf:  # x · (-inf), saturated: every finite code is -+448
            finite = data[1].float()[torch.isfinite(x[1])]
            assert (finite.abs() == 448).all() and (ref_data[1].float()[torch.isfinite(x[1])] == 0).all()
        assert torch.equal(_bytes(data[2]), _bytes(ref_data[2])) and torch.equal(sf[2], ref_sf[2])


def _swiglu_backward_reference(x, grad_out, weight, pos_to_token_topk, num_per_channels, clamp=None):
    """``tile_kernels.torch.swiglu_backward`` (36d9e45), as written there: ``(out, x_grad, weight_grad)`` in FP32."""
    data, sf = x
    values = data.float() * sf.repeat_interleave(num_per_channels, dim=1)
    h = values.shape[1] // 2
    xp, yp = values[:, :h].clone(), values[:, h:].clone()
    if clamp is not None:
        xc, yu, yl = xp > clamp, yp > clamp, yp < -clamp
        xp[xc], yp[yu], yp[yl] = clamp, clamp, -clamp
    tmp = 1.0 + torch.exp(-xp)
    s = torch.ones_like(xp) / tmp
    mask = pos_to_token_topk >= 0
    k = weight.shape[1]
    w = torch.zeros(values.shape[0])
    w[mask] = weight[pos_to_token_topk[mask].long() // k, pos_to_token_topk[mask].long() % k]
    g = grad_out.float()
    gws = g * w[:, None] * s
    inner = (xp.double() * (1.0 - s).double() + 1.0).float()  # an FMA (exact here up to a rare double rounding)
    xg, yg = gws * yp * inner, gws * xp
    if clamp is not None:
        xg[xc], yg[yu | yl] = 0.0, 0.0
    act = xp / tmp * yp
    wg = torch.zeros_like(weight)
    sums = (g * act).sum(1)
    p = pos_to_token_topk[mask].long()
    wg[p // k, p % k] = sums[mask]
    return act * w[:, None], torch.cat([xg, yg], 1), wg


def test_swiglu_kernels_are_upstreams_references(tk):
    g = torch.Generator().manual_seed(4)
    rows, h, tokens, k = 24, 256, 10, 3
    x = torch.randn(rows, 2 * h, generator=g).bfloat16() * 3
    p2tt = torch.randperm(tokens * k, generator=g)[:rows].int()
    weights = torch.rand(tokens, k, generator=g)
    pos_to_expert = torch.where(torch.rand(rows, generator=g) < 0.2, -1, 1).int()
    for clamp in (None, 10.0, 0.5):
        count = torch.zeros(3, dtype=torch.int64)
        data, sf = tk.quant.swiglu_forward_and_per_token_cast(
            x, "e4m3", 128, p2tt, weights, pos_to_expert, round_sf=True, swiglu_clamp_value=clamp,
            clamped_count=None if clamp is None else count,
        )  # fmt: skip
        ref_count = torch.zeros(3, dtype=torch.int64)
        active = pos_to_expert >= 0
        y = tk._ref.swiglu_forward(x[active], p2tt[active], weights, clamp, ref_count if clamp else None)
        ref_data, ref_sf = tk._ref.cast(y, "e4m3", (1, 128), round_sf=True)
        assert torch.equal(_bytes(data[active]), _bytes(ref_data)) and torch.equal(sf[active], ref_sf)
        assert torch.equal(count, ref_count)  # the skipped rows count no clamp
    # backward
    quantized = tk.quant.per_token_cast(torch.randn(rows, 2 * h, generator=g) * 2, "e4m3", 128, round_sf=True)
    grad = torch.randn(rows, h, generator=g).bfloat16()
    ttp = torch.full((tokens, k), -1, dtype=torch.int32)
    ttp.view(-1)[p2tt.long()] = torch.arange(rows, dtype=torch.int32)
    for clamp in (None, 0.5):
        out, (q, q_sf), x_grad, w_grad = tk.quant.swiglu_backward_and_per_token_cast(
            quantized, grad, weights, p2tt, ttp, 128, round_sf=True, swiglu_clamp_value=clamp
        )
        ref_out, ref_xg, ref_wg = _swiglu_backward_reference(quantized, grad, weights, p2tt, 128, clamp)
        assert out.dtype == x_grad.dtype == torch.bfloat16
        assert torch.equal(out, ref_out.bfloat16()) and torch.equal(x_grad, ref_xg.bfloat16())
        ref_q, ref_q_sf = tk._ref.cast(ref_xg, "e4m3", (1, 128), round_sf=True)
        assert torch.equal(_bytes(q), _bytes(ref_q)) and torch.equal(q_sf, ref_q_sf)
        torch.testing.assert_close(w_grad, ref_wg, atol=1e-4, rtol=1e-4)  # upstream's bound


def test_the_later_releases_rmsnorm_follows_its_docstring(later):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 7, 512, generator=g).bfloat16()
    r = torch.randn(2, 7, 512, generator=g).bfloat16()
    w = torch.randn(512, generator=g).bfloat16()
    out, rstd, norm_input = later.quant.norm_forward(x, w, 1e-6, residual=r, out_scale=0.5)
    s = (x + r).double()
    ref_rstd = (s.square().mean(-1) + 1e-6).rsqrt()
    assert norm_input.dtype == x.dtype and torch.equal(norm_input, (x + r))
    assert rstd.dtype == torch.float32 and calc_diff(rstd, ref_rstd) < 1e-12
    assert out.dtype == x.dtype and calc_diff(out, s * ref_rstd[..., None] * w.double() * 0.5) < 1e-5
    assert later.quant.norm_forward(x, w, 1e-6)[2] is x  # aliases x without a residual
    (q, sf), out_bf16, rstd2, _ = later.quant.norm_forward_and_per_token_cast(
        x, w, 1e-6, "e4m3", 32, residual=r, out_scale=0.5, round_sf=True, with_out_bf16=True
    )
    assert sf.shape == (2, 7, 16) and torch.equal(out_bf16, out) and torch.equal(rstd2, rstd)
    # "equals per_token_cast of norm_forward"
    ref_q, ref_sf = later.quant.per_token_cast(out.reshape(-1, 512), "e4m3", 32, round_sf=True)
    assert torch.equal(_bytes(q.reshape(-1, 512)), _bytes(ref_q)) and torch.equal(sf.reshape(-1, 16), ref_sf)
    with pytest.raises(AssertionError, match=r"hidden % 16 == 0 and hidden <= 8192"):
        later.quant.norm_forward(torch.randn(2, 8208), None, 1e-6)
    with pytest.raises(AssertionError, match=r"the unquantized output must match the input dtype"):
        later.quant.norm_forward_and_per_token_cast(x, w, 1e-6, "fp32", None)


def test_the_later_releases_rope_rotates_in_place(later):
    g = torch.Generator().manual_seed(6)
    angle = torch.rand(32, 64, generator=g) * 6
    cache = torch.cat([angle.cos(), angle.sin()], 1)
    q = torch.randn(10, 4, 128, generator=g)
    positions = torch.randint(0, 30, (10,), generator=g)
    original = q.clone()
    assert later.transform.apply_rotary(q, cache, positions=positions, seqlen_offset=2) is None
    c, s = cache[positions + 2, :64][:, None], cache[positions + 2, 64:][:, None]
    a, b = original[..., :64].double(), original[..., 64:].double()
    assert calc_diff(q, torch.cat([a * c - b * s, a * s + b * c], -1)) < 1e-12
    later.transform.apply_rotary(q, cache, positions=positions, seqlen_offset=2, conjugate=True)
    assert calc_diff(q, original) < 1e-12
    with pytest.raises(later._standin.Panic, match="out of bounds"):
        later.transform.apply_rotary(q, cache, positions=positions + 10)
    with pytest.raises(AssertionError, match=r"rot_dim in \(32, 64, 128, 256\)"):
        later.transform.apply_rotary(torch.randn(4, 2, 48), torch.rand(8, 48))


def test_each_release_has_its_names(tk):
    assert not hasattr(tk.quant, "norm_forward") and not hasattr(tk, "transform")
    with pytest.raises(ImportError):
        import tile_kernels.transform  # noqa: F401
    assert "pos_to_token_topk" in tk.quant.swiglu_forward_and_per_token_cast.__code__.co_varnames
    tk._standin.configure(version="cd8f86c")
    try:
        import tile_kernels.transform as transform

        assert (
            hasattr(tk.quant, "norm_forward") and hasattr(transform, "apply_rotary") and tk.config.is_ascend() is False
        )
        assert "psum_num_tokens_per_expert" in tk.quant.swiglu_forward_and_per_token_cast.__code__.co_varnames
        with pytest.raises(AssertionError, match=r"num_per_channels in \(16, 32, 64, 128\) and hidden % 64 == 0"):
            tk.quant.per_token_cast(torch.randn(2, 192), "e4m3", 192)  # the first release takes a row-wide block
    finally:
        tk._standin.configure()
    assert tk.quant.per_token_cast(torch.randn(2, 192), "e4m3", 192)[1].shape == (2, 1)
