"""The quant ops' C++ kernels against the plain-torch reference (quant.reference, DeepGEMM's math) bit for bit,
over shapes, blocks, strides, input dtypes, NaN, infinities, huge and tiny values; their gradients; and the casts
of quant.casts matching the reference."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_ascend_moe import quant
from torch_ascend_moe.ops.quant import dequantize, quantize_fp4, quantize_fp8
from torch_ascend_moe.quant import reference

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_SPECIAL = (float("nan"), float("inf"), -float("inf"), 3e38, -3e38, 1e-30, 0.0, -0.0, 448.0, 6.0)


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Identical bits, except that a NaN may carry any sign or payload (torch's own reductions differ there)."""
    assert got.dtype == expected.dtype and got.shape == expected.shape, f"{what}: {got.dtype}{list(got.shape)}"
    assert got.stride() == expected.stride(), f"{what}: strides {got.stride()} != {expected.stride()}"
    if got.dtype in (torch.uint8, torch.int32, torch.int16):
        assert torch.equal(got, expected), f"{what}: codes differ"
        return
    nan = expected.float().isnan()
    assert torch.equal(got.float().isnan(), nan), f"{what}: NaN elsewhere"
    bits = _BITS[got.element_size()]
    same = torch.equal(got.view(bits)[~nan], expected.view(bits)[~nan])
    assert same, f"{what}: {(got.view(bits) != expected.view(bits)).sum().item()} elements differ"


@st.composite
def _inputs(draw):
    m, n = draw(st.integers(0, 40)), draw(st.integers(0, 70))
    n += n % 2  # even: FP4 packs two codes per byte
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64]))
    seed = draw(st.integers(0, 2**31))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g, dtype=torch.float64) * 10.0 ** draw(st.integers(-8, 8))
    for _ in range(draw(st.integers(0, 4)) if x.numel() else 0):
        i, j = draw(st.integers(0, m - 1)), draw(st.integers(0, n - 1))
        x[i, j] = draw(st.sampled_from(_SPECIAL))
    layout = draw(st.sampled_from(["contiguous", "transposed", "sliced"]))
    if layout == "transposed":
        x = x.t().contiguous().t()
    elif layout == "sliced":
        x = torch.cat([x, x], dim=1)[:, ::2] if n else x
    block = [draw(st.sampled_from([1, 2, 3, 7, 32, 128, 1000])), draw(st.sampled_from([1, 2, 5, 16, 32, 128, 500]))]
    ue8m0 = draw(st.booleans())
    packed = ue8m0 and draw(st.booleans())
    return x.to(dtype), block, ue8m0, packed


@settings(max_examples=250, deadline=None)
@given(_inputs())
def test_kernels_match_the_reference_bit_for_bit(args):
    x, block, ue8m0, packed = args
    for op, ref in ((quantize_fp8, reference.quantize_fp8), (quantize_fp4, reference.quantize_fp4)):
        data, scale = op(x, block, use_ue8m0=ue8m0, use_packed_ue8m0=packed)
        ref_data, ref_scale = ref(x, block, ue8m0, packed)
        assert_same_bits(data, ref_data, f"{op.__name__} data")
        assert_same_bits(scale, ref_scale, f"{op.__name__} scale")
        for out_dtype in (None, torch.bfloat16, torch.float16, torch.float64):
            got = dequantize(data, scale, block, out_dtype=out_dtype)
            assert_same_bits(got, reference.dequantize(data, scale, block, out_dtype), f"dequantize {out_dtype}")


@settings(max_examples=40, deadline=None)
@given(_inputs())
def test_dequantize_reads_every_scale_format(args):
    """FP32, float8_e8m0fnu, int32 and int16 (DeepGEMM-Ascend) UE8M0 scales decode to the same values."""
    x, block, _, _ = args
    data, sf = quantize_fp8(x, block, use_ue8m0=True)
    expected = dequantize(data, sf, block)
    assert_same_bits(dequantize(data, sf.to(torch.float8_e8m0fnu), block), expected, "e8m0")
    packed = quantize_fp8(x, block, use_ue8m0=True, use_packed_ue8m0=True)[1]
    assert_same_bits(dequantize(data, packed, block), expected, "int32")
    int16 = quant.repack_ue8m0(packed, torch.int16)[:, : -(-sf.shape[1] // 2)]  # the same bytes, 2 per word
    assert_same_bits(dequantize(data, int16.contiguous(), block), expected, "int16")


def test_nan_block_dequantizes_to_nan_and_others_survive():
    x = torch.randn(4, 256)
    x[1, 3] = float("nan")
    for ue8m0 in (False, True):
        data, sf = quantize_fp8(x, (1, 128), use_ue8m0=ue8m0)
        back = dequantize(data, sf, (1, 128))
        assert back[1, :128].isnan().all() and not back[1, 128:].isnan().any()
        assert not back[[0, 2, 3]].isnan().any()
        fp4, sf4 = quantize_fp4(x, (1, 128), use_ue8m0=ue8m0)
        assert dequantize(fp4, sf4, (1, 128))[1, :128].isnan().all()
    codes = quantize_fp8(x, (1, 128), use_ue8m0=True, use_packed_ue8m0=True)[1].view(torch.uint8)
    assert codes[1, 0] == 255 and (codes[[0, 2, 3], :2] != 255).all() and codes[1, 1] != 255  # UE8M0 NaN: code 255


def test_packed_tail_is_scale_one():
    _, packed = quantize_fp8(torch.randn(3, 300), (1, 128), use_ue8m0=True, use_packed_ue8m0=True)
    assert packed.shape == (3, 1) and packed.view(torch.uint8)[:, 3].eq(127).all()


def test_casts_are_the_ops():
    x = torch.randn(40, 300, dtype=torch.bfloat16)
    pairs = [
        (quant.per_token_cast_to_fp8(x, True), reference.quantize_fp8(x, (1, 128), True, False)),
        (quant.per_block_cast_to_fp8(x, False), reference.quantize_fp8(x, (128, 128), False, False)),
        (quant.per_channel_cast_to_fp8(x[:32], True, 32), reference.quantize_fp8(x[:32], (32, 1), True, False)),
        (quant.block_cast_to_fp8(x, (3, 5), True), reference.quantize_fp8(x, (3, 5), True, False)),
        (quant.per_token_cast_to_fp4(x, True, 32, True), reference.quantize_fp4(x, (1, 32), True, True)),
    ]
    for (data, sf), (ref_data, ref_sf) in pairs:
        assert_same_bits(data.view(ref_data.dtype), ref_data, "data")
        assert_same_bits(sf, ref_sf, "scale")
    q, sf = quant.per_custom_dims_cast_to_fp8(x.view(4, 10, 300), (0, 2), False)
    ref_q, ref_sf = reference.quantize_fp8(x.view(4, 10, 300).permute(0, 2, 1).reshape(1200, 10), (1, 10), False, False)
    assert_same_bits(q, ref_q.view(4, 300, 10).permute(0, 2, 1).contiguous(), "custom dims data")
    assert_same_bits(sf, ref_sf.view(4, 300), "custom dims scale")
    data, sf = quant.per_token_cast_to_fp4(x, True, 32, True)
    got = quant.cast_back_from_fp4(data.view(2, 20, 150), sf.view(2, 20, -1), 32, use_packed_ue8m0=True)
    assert_same_bits(got.view(40, 300), reference.dequantize(data.view(torch.uint8), sf, (1, 32), None), "back")


def test_packed_fp8_cast_pads_a_short_row_of_scales_with_one():
    """DeepGEMM 2.8 pads a scale count that is not a multiple of 4 with 1.0 (2.6.1 asserted)."""
    x = torch.randn(2, 300)
    data, packed = quant.per_token_cast_to_fp8(x, True, 128, use_packed_ue8m0=True)
    ref_data, sf = quant.per_token_cast_to_fp8(x, True, 128)
    assert torch.equal(data.view(torch.uint8), ref_data.view(torch.uint8)) and packed.shape == (2, 1)
    codes = packed.contiguous().view(torch.uint8).view(2, 4)
    assert torch.equal(codes[:, :3].int(), ((sf.view(torch.int32) >> 23) & 0xFF)) and bool((codes[:, 3] == 127).all())


def test_quantize_outputs_carry_no_gradient():
    x = torch.randn(8, 256, requires_grad=True)
    for op in (quantize_fp8, quantize_fp4):
        data, sf = op(x, (1, 128), use_ue8m0=True)
        assert not data.requires_grad and not sf.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        dequantize(*quantize_fp8(x)).sum().backward()


def test_dequantize_scale_gradient_is_the_block_sum():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 300, generator=g)
    for block in ((1, 128), (3, 5), (128, 128)):
        data, sf = reference.quantize_fp8(x, block, False, False)
        sf.requires_grad_()
        grad = torch.randn(7, 300, generator=g, dtype=torch.float64)
        (got,) = torch.autograd.grad(dequantize(data, sf, block, out_dtype=torch.float64), sf, grad)
        rows, cols = min(block[0], 7), min(block[1], 300)
        padded = torch.nn.functional.pad(grad * data.double(), (0, -300 % cols, 0, -7 % rows))
        expected = padded.view(padded.shape[0] // rows, rows, -1, cols).sum((1, 3))
        torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
    codes = sf.detach().to(torch.float8_e8m0fnu).requires_grad_()
    with pytest.raises(RuntimeError, match=r"dequantize: argument 'scale' requires grad, but only FP32 scales"):
        dequantize(data, codes, block).sum().backward()


def test_fake_quantize_is_straight_through_on_the_ops():
    x = torch.randn(4, 64, requires_grad=True)
    for fmt in ("fp8", "fp4"):
        y = quant.fake_quantize(x, fmt, 32)
        (grad,) = torch.autograd.grad(y.sum(), x)
        assert grad.eq(1).all()
        data, sf = quant.quantize_rows(x.detach(), fmt, 32)
        assert torch.equal(y.detach(), quant.dequantize_rows(data, sf, 32))
