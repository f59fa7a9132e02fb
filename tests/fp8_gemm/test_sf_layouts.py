"""deep_gemm's scale-factor layout helpers (specs/deepgemm_api.md §11): values, shapes and exact strides."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from torch_ascend_moe import quant
from torch_ascend_moe.deep_gemm.utils.math import align, ceil_div


def _pow2_scales(*shape, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.pow(2.0, torch.randint(-20, 10, shape, generator=g).float())


def _reference_packed(sf: torch.Tensor) -> torch.Tensor:
    """Upstream's test reference: pad K-blocks to 4, pack bytes little-endian, lay out MN-major aligned."""
    padded = torch.nn.functional.pad(sf, (0, (-sf.shape[-1]) % 4))
    codes = padded.contiguous().view(torch.int32) >> 23
    words = codes[..., 0::4] | codes[..., 1::4] << 8 | codes[..., 2::4] << 16 | codes[..., 3::4] << 24
    return words


@pytest.mark.parametrize("groups", [None, 3])
@pytest.mark.parametrize("mn,sf_k", [(1, 4), (7, 3), (129, 57), (8, 1)])
def test_mn_major_tma_aligned_tensor(groups, mn, sf_k):
    sf = torch.randn(*([groups] if groups else []), mn, sf_k)
    out = deep_gemm.get_mn_major_tma_aligned_tensor(sf)
    aligned = align(mn, 4)
    expected_strides = ((aligned * sf_k,) if groups else ()) + (1, aligned)
    assert torch.equal(out, sf)
    if mn > 1 and sf_k > 1:
        assert out.stride() == expected_strides
    assert deep_gemm.get_mn_major_tma_aligned_tensor(out) is out  # already laid out: returned as is


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("groups", [None, 2])
@pytest.mark.parametrize("mn,sf_k", [(5, 1), (8, 4), (129, 57), (64, 7)])
def test_packed_ue8m0_tensor(groups, mn, sf_k, transposed):
    shape = ([groups] if groups else []) + [mn, sf_k]
    sf = _pow2_scales(*shape)
    if transposed:
        sf = sf.mT.contiguous().mT
    out = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf)
    assert out.dtype == torch.int32 and out.shape == (*shape[:-1], ceil_div(sf_k, 4))
    assert torch.equal(out, _reference_packed(sf))
    if mn > 1 and out.shape[-1] > 1:
        aligned = align(mn, 4)
        assert out.stride()[-2:] == (1, aligned)
        if groups:
            assert out.stride(0) == aligned * out.shape[-1]
    # Unpacking gives the scales back exactly (tail codes 0 past sf_k).
    assert torch.equal(quant.unpack_ue8m0_from_int(out)[..., :sf_k], sf)


def test_packed_ue8m0_psum_layout_zeroes_rows_outside_groups():
    deep_gemm.set_mk_alignment_for_contiguous_layout(128)
    sf = _pow2_scales(512, 8)
    psum = torch.tensor([100, 300, 400], dtype=torch.int32)  # groups [0,100), [128,300), [384,400)
    out = deep_gemm.get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum_layout=psum)
    inside = torch.zeros(512, dtype=torch.bool)
    inside[0:100] = inside[128:300] = inside[384:400] = True
    assert torch.equal(out[inside], _reference_packed(sf)[inside])
    assert (out[~inside] == 0).all()


def test_transform_sm90_paths_keep_fp32():
    sfa = torch.rand(33, 4) + 0.5  # (1, 128): any positive FP32 scale
    out = deep_gemm.transform_sf_into_required_layout(sfa, 33, 512, (1, 128, 128), is_sfa=True, disable_ue8m0_cast=True)
    assert torch.equal(out, sfa) and out.stride() == (1, 36)
    sfb = torch.rand(3, 4) + 0.5
    assert deep_gemm.transform_sf_into_required_layout(sfb, 300, 512, (128, 128), disable_ue8m0_cast=True) is sfb


def test_transform_sm100_broadcasts_and_packs():
    sfb = _pow2_scales(3, 4)  # 128 x 128 blocks of a [300, 512] weight
    out = deep_gemm.transform_sf_into_required_layout(sfb, 300, 512, (1, 128, 128), is_sfa=False)
    assert out.dtype == torch.int32 and out.shape == (300, 1) and out.stride() == (1, 300)
    unpacked = quant.unpack_ue8m0_from_int(out)[:, :4]
    assert torch.equal(unpacked, sfb.repeat_interleave(128, dim=0)[:300])
    # Already-packed int32 scales in that layout are accepted as they are.
    assert deep_gemm.transform_sf_into_required_layout(out, 300, 512, (1, 128)) is out


def test_transformed_scales_drive_the_gemm():
    """Scales prepared for an SM100 kernel (per-row, packed UE8M0, MN-major) give the same product."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(16, 512, generator=g), torch.randn(40, 512, generator=g)
    a, sfa = quant.per_token_cast_to_fp8(x, True)
    b, sfb = quant.per_block_cast_to_fp8(w, True)
    expected = torch.empty(16, 40)
    deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), expected, recipe=(1, 128, 128))
    psfa = deep_gemm.transform_sf_into_required_layout(sfa, 16, 512, (1, 128, 128), is_sfa=True)
    psfb = deep_gemm.transform_sf_into_required_layout(sfb, 40, 512, (1, 128, 128), is_sfa=False)
    d = torch.empty(16, 40)
    deep_gemm.fp8_gemm_nt((a, psfa), (b, psfb), d, recipe=(1, 1, 128))
    assert torch.equal(d, expected)


def test_transform_bad_inputs():
    api = deep_gemm.transform_sf_into_required_layout
    with pytest.raises(ValueError, match="argument 'sf' values: expected positive powers of two"):
        api(torch.full((4, 4), 0.3), 4, 512, (1, 128), disable_ue8m0_cast=False)
    with pytest.raises(ValueError, match=r"argument 'sf' size\(-2\) \(MN blocks\): expected 4"):
        api(torch.ones(3, 4), 4, 512, (1, 128))
    with pytest.raises(ValueError, match=r"argument 'sf' size\(-1\) \(K blocks\): expected 1 \(ceil\(k / 512\)\)"):
        api(torch.ones(4, 4, dtype=torch.int32), 4, 512, (1, 128))
    with pytest.raises(ValueError, match="argument 'is_sfa' value"):
        api(torch.ones(4, 4), 4, 512, (1, 128, 128))
    with pytest.raises(ValueError, match="argument 'sf' layout: expected MN-major"):
        api(torch.ones(8, 2, dtype=torch.int32), 8, 1024, (1, 128))  # K-major, not MN-major
    with pytest.raises(ValueError, match="argument 'recipe'"):
        api(torch.ones(1, 4), 4, 512, (64, 128), disable_ue8m0_cast=True)
    with pytest.raises(ValueError, match="argument 'sf' dtype"):
        api(torch.ones(4, 4, dtype=torch.float16), 4, 512, (1, 128))


@pytest.mark.parametrize("gran_k", [32, 128])
@pytest.mark.parametrize("use_psum", [False, True])
def test_k_grouped_packing(gran_k, use_psum):
    ks = [256, 0, 96, 640]  # an empty group and a tail that is not a multiple of 4 * gran_k
    alignment = 32
    rows = [ceil_div(k, gran_k) for k in ks]
    sf = _pow2_scales(sum(rows), 12)
    if use_psum:
        ends, start = [], 0
        for k in ks:
            ends.append(start + k)
            start = align(start + k, alignment)
        layout = torch.tensor(ends, dtype=torch.int32)
    else:
        layout = torch.tensor(ks, dtype=torch.int32)
    out = deep_gemm.get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor(
        sf, layout, ks, gran_k, alignment, use_psum_layout=use_psum
    )
    assert out.dtype == torch.int32 and out.is_contiguous()
    assert out.shape == (sum(ceil_div(r, 4) for r in rows), 12)
    offset_in = offset_out = 0
    for r in rows:
        expected = _reference_packed(sf[offset_in : offset_in + r].T).T
        assert torch.equal(out[offset_out : offset_out + ceil_div(r, 4)], expected)
        offset_in, offset_out = offset_in + r, offset_out + ceil_div(r, 4)


def test_alignment_helpers(monkeypatch):
    from torch_ascend_moe.deep_gemm import runtime

    assert deep_gemm.get_mk_alignment_for_contiguous_layout() == 128
    # upstream's rule by architecture: the legacy 128 off SM100 (here: no GPU), SM100's covering block on SM100
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout() == 128
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout(24) == 128
    monkeypatch.setattr(runtime, "_arch_major", lambda: 10)
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout() == 224
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout(24) == 32
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout(230) == 224
    monkeypatch.setattr(runtime, "_arch_major", lambda: 9)
    assert deep_gemm.get_theoretical_mk_alignment_for_contiguous_layout(24) == 128
    with pytest.raises(ValueError, match="argument 'alignment'"):
        deep_gemm.set_mk_alignment_for_contiguous_layout(0)
