"""DeepGEMM's reference quantizers: shapes, scale formats, accuracy, exactness and idempotence."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_ascend_moe.deep_gemm as deep_gemm
from torch_ascend_moe import quant
from torch_ascend_moe.testing import calc_diff


def _randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _is_power_of_two(sf):
    return bool((quant.ceil_to_ue8m0(sf) == sf).all())


@pytest.mark.parametrize("m,n,gran_k", [(1, 128, 128), (33, 300, 128), (16, 7168, 128), (5, 96, 32)])
@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_token_fp8(m, n, gran_k, use_ue8m0):
    x = _randn(m, n, seed=n)
    q, sf = quant.per_token_cast_to_fp8(x, use_ue8m0, gran_k)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (m, n)
    assert sf.dtype == torch.float32 and sf.shape == (m, -(-n // gran_k))
    assert not use_ue8m0 or _is_power_of_two(sf)
    assert calc_diff(quant.dequantize_fp8(q, sf, 1, gran_k), x) < 1e-3
    # Each group's largest magnitude lands at (or, with UE8M0, below) 448, never above.
    assert q.float().abs().max() <= quant.FP8_MAX


def test_per_token_fp8_packed_scales():
    x = _randn(8, 512)
    q, packed = quant.per_token_cast_to_fp8(x, True, 128, use_packed_ue8m0=True)
    _, sf = quant.per_token_cast_to_fp8(x, True, 128)
    assert packed.dtype == torch.int32 and packed.shape == (8, 1)
    assert torch.equal(quant.unpack_ue8m0_from_int(packed), sf)
    with pytest.raises(ValueError, match=r"argument 'use_packed_ue8m0'"):
        quant.per_token_cast_to_fp8(x, False, use_packed_ue8m0=True)


def test_per_block_and_per_channel_fp8():
    x = _randn(300, 260)
    q, sf = quant.per_block_cast_to_fp8(x, True)
    assert q.shape == (300, 260) and sf.shape == (3, 3) and _is_power_of_two(sf)
    assert calc_diff(quant.dequantize_fp8(q, sf, 128, 128), x) < 1e-3
    x = _randn(256, 40)
    q, sf = quant.per_channel_cast_to_fp8(x, False)
    assert sf.shape == (2, 40)
    assert calc_diff(q.float() * sf.repeat_interleave(128, dim=0), x) < 1e-3
    with pytest.raises(ValueError, match=r"argument 'x' size\(0\): expected a multiple of gran_k=128, got 100"):
        quant.per_channel_cast_to_fp8(x[:100], False)


def test_per_custom_dims_fp8_per_token_kv():
    kv = _randn(50, 64)
    q, sf = quant.per_custom_dims_cast_to_fp8(kv, (0,), False)
    assert sf.shape == (50,)
    assert calc_diff(q.float() * sf[:, None], kv) < 1e-3
    q3, sf3 = quant.per_custom_dims_cast_to_fp8(_randn(4, 5, 6), (0, 2), True)
    assert sf3.shape == (4, 6) and _is_power_of_two(sf3)


def test_requantizing_quantized_values_is_exact():
    """With power-of-two scales, values that are already E4M3 times the scale quantize to themselves."""
    q, sf = quant.per_token_cast_to_fp8(_randn(16, 384), True)
    deq = quant.dequantize_fp8(q, sf, 1, 128)
    q2, sf2 = quant.per_token_cast_to_fp8(deq, True)
    assert torch.equal(sf2, sf)
    assert torch.equal(q2.view(torch.uint8), q.view(torch.uint8))


@pytest.mark.parametrize("gran_k,packed", [(128, False), (32, False), (32, True)])
def test_fp4_cast_and_back(gran_k, packed):
    x = _randn(24, 256, seed=gran_k)
    data, sf = quant.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=gran_k, use_packed_ue8m0=packed)
    assert data.dtype == torch.int8 and data.shape == (24, 128)
    assert sf.dtype == (torch.int32 if packed else torch.float32)
    back = quant.cast_back_from_fp4(data, sf, gran_k, use_packed_ue8m0=packed)
    assert calc_diff(back, x) < 2e-2
    # Every dequantized value is an E2M1 value times its group's scale.
    scales = quant.unpack_ue8m0_from_int(sf) if packed else sf
    ratio = back / scales.repeat_interleave(gran_k, dim=-1)[:, :256]
    assert torch.isin(ratio.abs(), torch.tensor(quant.E2M1_VALUES)).all()


def test_fp4_packed_scale_count_is_padded_with_one():
    data, sf = quant.per_token_cast_to_fp4(_randn(2, 64), True, gran_k=32, use_packed_ue8m0=True)
    scales = quant.unpack_ue8m0_from_int(sf)
    assert scales.shape == (2, 4) and scales[:, 2:].eq(1.0).all()


def test_fp4_bad_inputs():
    with pytest.raises(ValueError, match=r"argument 'x' size\(1\): expected an even number"):
        quant.per_token_cast_to_fp4(_randn(2, 63), True)
    with pytest.raises(ValueError, match=r"argument 'x' rank"):
        quant.per_token_cast_to_fp4(_randn(2, 2, 64), True)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 20).map(lambda v: 2 * v), n=st.integers(1, 40).map(lambda v: 2 * v))
def test_transpose_packed_fp4_moves_codes(m, n):
    data, _ = quant.per_token_cast_to_fp4(_randn(m, n, seed=m * n), True, gran_k=32)
    transposed = quant.transpose_packed_fp4(data)
    assert transposed.shape == (n, m // 2)
    assert torch.equal(quant.unpack_e2m1(transposed), quant.unpack_e2m1(data).t())
    assert torch.equal(quant.transpose_packed_fp4(transposed), data)


def test_compat_names_are_the_reference_quantizers():
    for name in (
        "per_token_cast_to_fp8",
        "per_block_cast_to_fp8",
        "per_token_cast_to_fp4",
        "cast_back_from_fp4",
        "ceil_to_ue8m0",
        "pack_ue8m0_to_int",
        "transpose_packed_fp4",
    ):
        assert getattr(deep_gemm, name) is getattr(quant, name)
        assert getattr(deep_gemm.utils, name) is getattr(quant, name)
    # upstream's unpacking is a bit shift (code 0 -> 0.0, 255 -> inf), not E8M0's decoding
    # (tests/gemm/test_deep_gemm_hostile_calls.py); the two agree on every other code
    codes = torch.arange(1, 253, dtype=torch.uint8).view(torch.int32)
    assert torch.equal(deep_gemm.unpack_ue8m0_from_int(codes), quant.unpack_ue8m0_from_int(codes))
    assert deep_gemm.utils.unpack_ue8m0_from_int is deep_gemm.unpack_ue8m0_from_int


@pytest.mark.parametrize("shape", [(0, 128), (3, 0), (0, 0)])
def test_empty_inputs(shape):
    for cast in (quant.per_token_cast_to_fp8, quant.per_block_cast_to_fp8, quant.per_token_cast_to_fp4):
        data, sf = cast(torch.zeros(shape), True)
        assert data.shape[0] == shape[0] and sf.shape[-1] == -(-shape[1] // 128)


def test_packed_fp4_is_row_major_even_from_transposed_codes():
    codes = torch.randint(0, 16, (6, 8), dtype=torch.uint8).t()  # a transposed view
    packed = quant.pack_e2m1(codes)
    assert packed.is_contiguous() and torch.equal(quant.unpack_e2m1(packed), codes)
