"""torch_ascend_moe.tile_kernels.quant on TileKernels' own test pattern: codes and scales bit for bit against the
spec's reference (tests/quant/specs.py: element by element, E2M1 by bits), the scale-factor layouts, sf-only and
precomputed-sf forms reproducing the full cast, cast-back accuracy and unbiased rounding, QuantTensor inputs and
the lossless FP4 -> FP8 re-cast."""

import pytest
import torch

import torch_ascend_moe.tile_kernels as tile_kernels
from tests.quant.specs import quantize_blocks_reference
from torch_ascend_moe.tile_kernels.testing.numeric import assert_equal, calc_diff, check_bias

quant = tile_kernels.quant
# (col_major, round_sf, packed): the two combinations upstream's tests use, and the plain one.
_LAYOUTS = [(False, True, False), (True, True, True), (False, False, False)]


def _expected_sf(sf: torch.Tensor, col_major: bool, packed: bool) -> torch.Tensor:
    """The reference's FP32 scales in the requested layout, written out element by element."""
    rows, cols = sf.shape
    if not col_major:
        return sf
    if not packed:
        storage = torch.zeros(cols, -(-rows // 4) * 4)
        storage[:, :rows] = sf.T
        return storage.T[:rows]
    words = -(-cols // 4)
    storage = torch.zeros(words, -(-rows // 4) * 4, dtype=torch.int32)
    exponents = (sf.view(torch.int32) >> 23) & 0xFF
    for r in range(rows):
        for w in range(words):
            value = 0
            for byte in range(4):
                if 4 * w + byte < cols:
                    value |= int(exponents[r, 4 * w + byte]) << (8 * byte)
            storage[w, r] = value - (1 << 32) if value >= 1 << 31 else value
    return storage.T[:rows]


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("num_per_channels", [32, 128, "hidden"])
@pytest.mark.parametrize("layout", _LAYOUTS, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_token_cast(fmt, num_per_channels, layout, dtype):
    col_major, round_sf, packed = layout
    g = torch.Generator().manual_seed(7)
    tokens, hidden = 67, 576
    npc = hidden if num_per_channels == "hidden" else num_per_channels
    x = (torch.randn(tokens, hidden, generator=g) * 10.0 ** torch.randint(-3, 4, (tokens, 1), generator=g)).to(dtype)
    data, sf = quant.per_token_cast(x, fmt, npc, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
                                    use_packed_ue8m0=packed)  # fmt: skip
    ref_data, ref_sf = quantize_blocks_reference(x, fmt, [1, npc], round_sf, None, None)
    expected_data = ref_data.to(torch.float8_e4m3fn) if fmt == "e4m3" else ref_data.view(torch.int8)
    assert_equal(data, expected_data)
    expected_sf = _expected_sf(ref_sf.float(), col_major, packed)
    assert sf.shape == expected_sf.shape and sf.dtype == expected_sf.dtype
    # The layout (a size-1 dim's stride carries no meaning, as torch treats it)
    assert all(a == b for a, b, n in zip(sf.stride(), expected_sf.stride(), sf.shape) if n > 1)
    assert torch.equal(sf, expected_sf)
    # The sf-only form reproduces the scales, the precomputed form the codes.
    assert torch.equal(quant.per_token_cast_with_sf_only(x, fmt, npc, None, col_major, round_sf, packed), sf)
    if round_sf and not packed:  # 1 / sf is the full cast's multiplier only for power-of-two scales
        assert_equal(quant.per_token_cast_with_precomputed_sf(x, fmt, npc, ref_sf.float()), data)
    back = quant.per_token_cast_back((data, sf), "fp32", npc)
    assert calc_diff(back, x) < (1e-3 if fmt == "e4m3" else 2e-2)
    if fmt == "e4m3":
        check_bias(back, x.float())


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1"])
@pytest.mark.parametrize("block", [(128, 128), (32, 32)])
@pytest.mark.parametrize("layout", _LAYOUTS[:2], ids=str)
def test_per_block_cast(fmt, block, layout):
    col_major, round_sf, packed = layout
    x = torch.randn(300, 256, generator=torch.Generator().manual_seed(8)).bfloat16()
    data, sf = quant.per_block_cast(x, fmt, block, col_major, round_sf, packed)
    ref_data, ref_sf = quantize_blocks_reference(x, fmt, list(block), round_sf, None, None)
    assert torch.equal(
        data.view(torch.uint8), (ref_data.to(torch.float8_e4m3fn) if fmt == "e4m3" else ref_data).view(torch.uint8)
    )
    assert torch.equal(sf, _expected_sf(ref_sf.float(), col_major, packed))
    assert torch.equal(quant.per_block_cast_with_sf_only(x, fmt, block, col_major, round_sf, packed), sf)
    assert_equal(quant.per_block_cast_with_precomputed_sf(x, fmt, block, ref_sf.float()), data)


def test_per_channel_cast():
    x = torch.randn(256, 128, generator=torch.Generator().manual_seed(9))
    for round_sf in (False, True):
        data, sf = quant.per_channel_cast(x, "e4m3", 128, round_sf=round_sf)
        ref_data, ref_sf = quantize_blocks_reference(x, "e4m3", [128, 1], round_sf, None, None)
        assert torch.equal(data.float(), ref_data.float()) and torch.equal(sf, ref_sf.float()) and sf.shape == (2, 128)


@pytest.mark.parametrize("out_block", [(1, 128), (32, 32), (128, 128)])
def test_lossless_fp4_to_fp8(out_block):
    """FP4 data with 1x32 power-of-two scales re-cast to E4M3 blocks: the dequantized values are unchanged bitwise
    while a block's magnitudes span at most 2^9 (upstream's condition)."""
    g = torch.Generator().manual_seed(10)
    x = torch.randn(256, 512, generator=g) * 2.0 ** torch.randint(-4, 5, (256, 1), generator=g)
    fp4 = quant.per_token_cast(x, "e2m1", 32, round_sf=True)
    data, sf = quant.per_block_cast_lossless(fp4, "e4m3", (1, 32), out_block, round_sf=True)
    assert_equal(quant.cast_back((data, sf), "fp32", out_block), quant.cast_back(fp4, "fp32", (1, 32)))


def test_quant_tensor_inputs_and_e2m1_decoding():
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(11))
    fp8 = quant.per_token_cast(x, "e4m3", 128, round_sf=True)
    again = quant.per_token_cast(fp8, "e2m1", 32, x_block_size=(1, 128), round_sf=True)
    direct = quant.per_token_cast(quant.cast_back(fp8, "fp32", (1, 128)), "e2m1", 32, round_sf=True)
    assert_equal(again[0], direct[0])  # a QuantTensor is dequantized with its block size first
    assert_equal(again[1], direct[1])
    packed = torch.tensor([[0x21, -0x6F]], dtype=torch.int8)  # codes 1, 2 | 1, 9 (0x91 as int8)
    assert quant.unpack_from_e2m1fn_x2(packed).tolist() == [[0.5, 1.0, 0.5, -0.5]]
    with pytest.raises(AssertionError, match="fmt"):
        quant.per_token_cast(x, "e3m2", 256)


@pytest.mark.parametrize("layout", [(False, True, False), (True, True, True), (False, False, False)], ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_per_token_cast_e5m6(layout, dtype):
    """E5M6 (per-row scales): codes and scales bit for bit against the spec's element-by-element reference in every
    layout; the round trip within upstream's thresholds on random and special values (min/max subnormal, min normal,
    with 65024 in the row)."""
    col_major, round_sf, packed = layout
    g = torch.Generator().manual_seed(12)
    hidden = 256
    inputs = [(torch.randn(37, hidden, generator=g) * 10.0 ** torch.randint(-3, 4, (37, 1), generator=g), False)]
    for value in (2.0**-20, 2.0**-14 * 63 / 64, 2.0**-14):
        special = torch.full((5, hidden), value)
        special[:, -1] = 65024.0
        inputs.append((special, True))
    for x, is_special in inputs:
        x = x.to(dtype)
        data, sf = quant.per_token_cast(x, "e5m6", hidden, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
                                        use_packed_ue8m0=packed)  # fmt: skip
        ref_data, ref_sf = quantize_blocks_reference(x, "e5m6", [1, hidden], round_sf, None, None)
        assert data.dtype == torch.uint8 and data.shape == (x.shape[0], hidden * 3 // 2)
        assert torch.equal(data, ref_data) and torch.equal(sf, _expected_sf(ref_sf.float(), col_major, packed))
        back = quant.cast_back((data, sf), "fp32", (1, hidden), x_special_fmt="e5m6")
        assert calc_diff(back, x.float()) < (5e-6 if is_special else 1e-4)
        assert_equal(back, tile_kernels.torch.cast_back_from_e5m6((data, sf), "fp32", (1, hidden)))


def test_e5m6_kernel_modules():
    """``quant.per_token_cast_to_e5m6_kernel`` / ``cast_back_e5m6_kernel`` (upstream's kernel-module names, reached
    only by their module paths): the per-token cast's bits and its inverse; upstream's asserts."""
    from torch_ascend_moe.tile_kernels.quant.cast_back_e5m6_kernel import cast_back_e5m6
    from torch_ascend_moe.tile_kernels.quant.per_token_cast_to_e5m6_kernel import per_token_cast_to_e5m6

    x = torch.randn(9, 64, generator=torch.Generator().manual_seed(13))
    data, sf = per_token_cast_to_e5m6(x, 64, True, True, True)
    ref = quant.per_token_cast(x, "e5m6", 64, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    assert torch.equal(data, ref[0]) and torch.equal(sf, ref[1])
    assert_equal(
        cast_back_e5m6((data, sf), "bf16", (1, 64)), quant.cast_back(ref, "bf16", (1, 64), x_special_fmt="e5m6")
    )
    with pytest.raises(AssertionError):
        per_token_cast_to_e5m6(x, 32)  # one scale per token: num_per_channels must be the hidden size
    with pytest.raises(AssertionError):
        cast_back_e5m6((data, sf), "fp16", (1, 64))


@pytest.mark.parametrize("fmt", ["e4m3", "e2m1", "e5m6"])
def test_zero_rows_with_packed_scales(fmt):
    """0 tokens (upstream's full test level adds them): every cast and cast-back of an empty tensor gives empty
    outputs in every scale layout (packed UE8M0 scales of 0 rows failed to reshape)."""
    x = torch.randn(0, 256)
    block = 256 if fmt == "e5m6" else 128
    for col_major, round_sf, packed in _LAYOUTS:
        q = quant.per_token_cast(x, fmt, block, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
                                 use_packed_ue8m0=packed)  # fmt: skip
        assert q[0].shape[0] == 0 and q[1].shape[0] == 0
        special = "e5m6" if fmt == "e5m6" else None
        assert quant.cast_back(q, "fp32", (1, block), x_special_fmt=special).shape == (0, 256)
        if fmt != "e5m6":
            assert quant.per_token_cast_back(q, "bf16", block).shape == (0, 256)
            again = quant.per_token_cast(q, "e4m3", 128, x_block_size=(1, block))
            assert again[0].shape == (0, 256)
    fp4 = quant.per_token_cast(x, "e2m1", 32, use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    assert quant.per_block_cast_lossless(fp4, "e4m3", x_block_size=(1, 32), out_block_size=(1, 128))[0].shape == (
        0,
        256,
    )


def test_e5m6_codes():
    from torch_ascend_moe.quant.encodings import decode_e5m6, encode_e5m6

    values = torch.tensor([65024.0, 2.0**-20, 2.0**-14, 1.0, -1.0, 1.0 + 2.0**-7, 1.0 + 3 * 2.0**-7, 0.0])
    codes = encode_e5m6(values)
    # 1 + 2^-7 is halfway between two codes: ties to the even one (1.0); 1 + 3·2^-7 goes up to the even 1 + 2^-5.
    assert codes.tolist() == [0x7BF, 0x001, 0x040, 0x3C0, 0xBC0, 0x3C0, 0x3C2, 0x000]
    assert decode_e5m6(codes).tolist() == [65024.0, 2.0**-20, 2.0**-14, 1.0, -1.0, 1.0, 1.0 + 2.0**-5, 0.0]


@pytest.mark.parametrize("round_sf", [False, True])
def test_per_channel_fused_and_transposed_casts(round_sf):
    """The per-channel casts' variants against the element-by-element reference: transposed codes; rows gathered by
    ``pos_to_token`` (-1: zero rows) from a plain or an FP8 1x128 QuantTensor input; SwiGLU (rounded to BF16) first."""
    from tests.swiglu.specs import forward_fp32

    g = torch.Generator().manual_seed(13)
    x = torch.randn(256, 192, generator=g).bfloat16()
    data, sf = quant.per_channel_cast_and_transpose(x, "e4m3", 32, round_sf)
    ref_data, ref_sf = quantize_blocks_reference(x, "e4m3", [32, 1], round_sf, None, None)
    assert (
        data.shape == (192, 256) and torch.equal(data.float(), ref_data.float().T) and torch.equal(sf, ref_sf.float())
    )
    pos = torch.randint(-1, 256, (48,), generator=g, dtype=torch.int32)
    rows = torch.stack([x[p] if p >= 0 else torch.zeros(192, dtype=torch.bfloat16) for p in pos.tolist()])
    data, sf = quant.per_channel_cast_fused(x, "e4m3", 128, round_sf, pos_to_token=pos)
    ref_data, ref_sf = quantize_blocks_reference(rows, "e4m3", [128, 1], round_sf, None, None)
    assert torch.equal(data.float(), ref_data.float()) and torch.equal(sf, ref_sf.float())
    x2 = torch.randn(128, 256, generator=g).bfloat16()
    fp8, fp8_sf = quant.per_token_cast(x2, "e4m3", 128)
    deq = fp8.float() * fp8_sf.repeat_interleave(128, 1)
    data, sf = quant.per_channel_cast_fused((fp8, fp8_sf), "e4m3", 128, round_sf, num_per_channels=128)
    ref_data, ref_sf = quantize_blocks_reference(deq, "e4m3", [128, 1], round_sf, None, None)
    assert torch.equal(data.float(), ref_data.float()) and torch.equal(sf, ref_sf.float())
    gate_up = (torch.randn(128, 256, generator=g) * 2).bfloat16()
    for without in (False, True):
        data, sf = quant.swiglu_forward_and_per_channel_cast_and_transpose(gate_up, "e4m3", 128, round_sf, without, 0.5)
        act = forward_fp32(gate_up, None, None, 1, None, 0.5).bfloat16()
        ref_data, ref_sf = quantize_blocks_reference(act, "e4m3", [128, 1], round_sf, None, None)
        want = ref_data.float() if without else ref_data.float().T
        assert torch.equal(data.float(), want) and torch.equal(sf, ref_sf.float())


def test_transpose():
    x = torch.randn(3, 128, 192)
    assert_equal(tile_kernels.transpose.batched_transpose(x), x.transpose(1, 2).contiguous())
    assert_equal(tile_kernels.transpose.transpose(x[0]), x[0].T.contiguous())
    with pytest.raises(AssertionError):
        tile_kernels.transpose.transpose(torch.randn(100, 64))


def test_packed_scales_are_int16_on_ascend(monkeypatch):
    """The Ascend-era rule: packed UE8M0 scales are two exponents per int16 there (four per int32 elsewhere)."""
    x = torch.randn(9, 384, generator=torch.Generator().manual_seed(14))
    data32, sf32 = quant.per_token_cast(x, "e4m3", 32, use_tma_aligned_col_major_sf=True, round_sf=True,
                                        use_packed_ue8m0=True)  # fmt: skip
    monkeypatch.setattr(tile_kernels.config, "is_ascend", lambda: True)
    data16, sf16 = quant.per_token_cast(x, "e4m3", 32, use_tma_aligned_col_major_sf=True, round_sf=True,
                                        use_packed_ue8m0=True)  # fmt: skip
    assert sf32.dtype == torch.int32 and sf16.dtype == torch.int16 and sf16.shape == (9, 6) and sf16.stride(0) == 1
    assert torch.equal(data16, data32)
    # The same exponent bytes per row (12 blocks: no padding either way), in words of two instead of four.
    assert torch.equal(sf16.contiguous().view(torch.uint8), sf32.contiguous().view(torch.uint8))
    assert_equal(quant.cast_back((data16, sf16), "fp32", (1, 32)), quant.cast_back((data32, sf32), "fp32", (1, 32)))


def test_norm_cast_into_given_data_allocates_column_major_scales():
    """``norm_forward_and_per_token_cast(out=(data, None))`` with column-major scales: the data lands in the buffer,
    the scales are allocated (the Ascend era's test passes exactly this)."""
    x = torch.randn(8, 128, generator=torch.Generator().manual_seed(3)).bfloat16()
    kwargs = dict(use_tma_aligned_col_major_sf=True, round_sf=True, use_packed_ue8m0=True)
    (data, sf), *_ = quant.norm_forward_and_per_token_cast(x, None, 1e-6, "e4m3", 32, **kwargs)
    buffer = torch.empty_like(data)
    (got, got_sf), *_ = quant.norm_forward_and_per_token_cast(x, None, 1e-6, "e4m3", 32, out=(buffer, None), **kwargs)
    assert got is buffer and torch.equal(got.view(torch.uint8), data.view(torch.uint8)) and torch.equal(got_sf, sf)
    with pytest.raises(AssertionError, match="row-major"):
        quant.norm_forward_and_per_token_cast(x, None, 1e-6, "e4m3", 32, out=(buffer, sf.clone()), **kwargs)


@pytest.mark.parametrize(("num_tokens", "hidden", "dtype", "layout"), [
    (0, 512, torch.bfloat16, (False, False, False)), (17, 512, torch.bfloat16, (False, True, False)),
    (17, 640, torch.float32, (True, True, True)), (3, 640, torch.float32, (True, False, False)),
])  # fmt: skip
def test_add_rmsnorm_and_cast_in_blocks_of_128(num_tokens, hidden, dtype, layout):
    """The Ascend era's ``add_rmsnorm_forward_and_per_token_cast`` (its test's cases) and the norm cast in blocks of
    128: the residual becomes the sum in place, the cast equals ``torch.cast`` of the reference norm; overlapping
    operands and a whole-row block are refused."""
    col_major, round_sf, packed = layout
    g = torch.Generator().manual_seed(1)
    x, residual = (torch.randn(num_tokens, hidden, generator=g).to(dtype) for _ in range(2))
    weight = torch.randn(hidden, generator=g).to(dtype)
    before = (x.clone(), residual.clone())
    normalized, _, summed = tile_kernels.torch.norm_forward_ref(x, weight, 1e-6, before[1])
    kwargs = dict(use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed)
    want = tile_kernels.torch.cast(normalized, "e4m3", (1, 128), **kwargs)
    data, sf = quant.add_rmsnorm_forward_and_per_token_cast(x, residual, weight, 1e-6, "e4m3", 128, **kwargs)
    assert torch.equal(x, before[0]) and torch.equal(residual, summed)
    assert torch.equal(data.view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(sf, want[1])
    storage = torch.randn(3, 512).bfloat16()
    with pytest.raises(AssertionError):
        quant.add_rmsnorm_forward_and_per_token_cast(storage[:2], storage[1:], storage[0], 1e-6, "e4m3", 128)
    with pytest.raises(AssertionError):
        quant.add_rmsnorm_forward_and_per_token_cast(x, residual, weight, 1e-6, "e4m3", hidden)
