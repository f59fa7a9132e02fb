"""Bit-level encodings: every E2M1 code, tie rounding, nibble order, UE8M0 edge cases and packings."""

import pytest
import torch

from torch_ascend_moe import quant

E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_every_e2m1_code_round_trips():
    codes = torch.arange(16, dtype=torch.uint8)
    values = quant.decode_e2m1(codes)
    assert values[:8].tolist() == E2M1
    assert values[8:].tolist() == [-v for v in E2M1]
    # -0 (code 8) decodes to zero; every other code survives encode(decode(code)).
    again = quant.encode_e2m1(values)
    assert again[:8].tolist() == list(range(8)) and again[9:].tolist() == list(range(9, 16))
    assert again[8].item() == 0


@pytest.mark.parametrize(
    "value,code",
    [
        (0.25, 0),
        (0.2501, 1),
        (0.75, 1),
        (0.7501, 2),
        (1.25, 2),
        (1.75, 3),
        (2.5, 4),
        (2.5001, 5),
        (3.5, 5),
        (5.0, 6),
        (5.0001, 7),
        (6.0, 7),
        (100.0, 7),
        (-0.75, 9),
        (-0.1, 0),
        (-6.0, 15),
    ],
)
def test_e2m1_ties_round_to_the_smaller_magnitude(value, code):
    assert quant.encode_e2m1(torch.tensor([value])).item() == code


def test_nibble_order_low_then_high():
    codes = torch.tensor([[1, 2, 15, 0]], dtype=torch.uint8)  # 0.5, 1.0, -6, 0
    packed = quant.pack_e2m1(codes)
    assert packed.tolist() == [[0x21, 0x0F]]
    assert torch.equal(quant.unpack_e2m1(packed), codes)
    assert torch.equal(quant.unpack_e2m1(packed.view(torch.int8)), codes)
    assert torch.equal(quant.unpack_e2m1(packed.view(torch.float4_e2m1fn_x2)), codes)
    with pytest.raises(ValueError, match=r"argument 'codes' size\(-1\): expected an even number"):
        quant.pack_e2m1(codes[:, :3])


def test_ue8m0_edge_codes():
    codes = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
    values = quant.unpack_ue8m0_from_int16(torch.cat([codes, codes[:1]]).view(torch.int16))
    assert values[0].item() == 2.0**-127
    assert values[1:6].tolist() == [2.0**-126, 0.5, 1.0, 2.0, 2.0**127]
    assert torch.isnan(values[6])
    # The same bytes read as PyTorch's float8_e8m0fnu give the same scales.
    assert torch.equal(codes[:6].view(torch.float8_e8m0fnu).float(), values[:6])


def test_ceil_to_ue8m0():
    x = torch.tensor([1.0, 0.5, 3.0, 0.3, -5.0, 0.0, 1e-45, 3e38])
    expected = [1.0, 0.5, 4.0, 0.5, 8.0, 2.0**-126, 2.0**-126, 2.0**127]
    assert quant.ceil_to_ue8m0(x).tolist() == expected


def test_packings_round_trip_and_convert():
    g = torch.Generator().manual_seed(0)
    exponents = torch.randint(-20, 20, (5, 12), generator=g)
    sf = torch.pow(2.0, exponents.float())
    as_int32 = quant.pack_ue8m0_to_int(sf)
    as_int16 = quant.pack_ue8m0_to_int16(sf)
    assert as_int32.shape == (5, 3) and as_int16.shape == (5, 6)
    assert torch.equal(quant.unpack_ue8m0_from_int(as_int32), sf)
    assert torch.equal(quant.unpack_ue8m0_from_int16(as_int16), sf)
    assert torch.equal(quant.repack_ue8m0(as_int32, torch.int16), as_int16)
    assert torch.equal(quant.repack_ue8m0(as_int16, torch.int32), as_int32)
    # Byte j of int32 word i is scale 4i + j (little-endian).
    word = int(as_int32[0, 0])
    assert [(word >> (8 * j)) & 0xFF for j in range(4)] == (exponents[0, :4] + 127).tolist()
    for fmt in (torch.float32, torch.int32, torch.int16, torch.float8_e8m0fnu):
        packed = {torch.float32: sf, torch.int32: as_int32, torch.int16: as_int16}.get(fmt)
        if fmt == torch.float8_e8m0fnu:
            packed = sf.to(torch.float8_e8m0fnu)
        assert torch.equal(quant.scales_to_float(packed), sf), fmt


def test_repack_pads_to_whole_words():
    sf = torch.tensor([[2.0, 4.0]])
    as_int32 = quant.repack_ue8m0(quant.pack_ue8m0_to_int16(sf), torch.int32)
    assert as_int32.shape == (1, 1)
    assert quant.unpack_ue8m0_from_int(as_int32)[0, :2].tolist() == [2.0, 4.0]


@pytest.mark.parametrize("bad", [3.0, -2.0, 0.75])
def test_packing_rejects_non_powers_of_two(bad):
    with pytest.raises(ValueError, match=r"pack_ue8m0_to_int: argument 'sf' values: expected positive powers of two"):
        quant.pack_ue8m0_to_int(torch.tensor([1.0, 2.0, 4.0, bad]))


def test_packing_bad_shapes_and_dtypes():
    with pytest.raises(ValueError, match=r"argument 'sf' size\(-1\): expected a multiple of 4, got 3"):
        quant.pack_ue8m0_to_int(torch.ones(3))
    with pytest.raises(ValueError, match=r"argument 'packed' dtype: expected torch.int32, got torch.int16"):
        quant.unpack_ue8m0_from_int(torch.zeros(2, dtype=torch.int16))
    with pytest.raises(ValueError, match=r"argument 'sf' dtype"):
        quant.scales_to_float(torch.zeros(2, dtype=torch.int8))
