"""torch_ascend_moe.deep_gemm's scaled GEMMs: tuples, recipes, scale packings, FP4 dtypes, layouts."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from torch_ascend_moe import fp8_gemm, quant
from torch_ascend_moe.testing import calc_diff

M, N, K = 16, 40, 256


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    return torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)


def test_default_recipe_fp32_scales(data):
    x, w = data
    a, b = quant.per_token_cast_to_fp8(x, False), quant.per_block_cast_to_fp8(w, False)
    d = torch.empty(M, N, dtype=torch.bfloat16)
    assert deep_gemm.fp8_gemm_nt(a, b, d) is None
    assert torch.equal(d, fp8_gemm(*a, *b))
    assert calc_diff(d, x.double() @ w.double().T) < 1e-3


def test_layout_aliases_transpose_data_and_scales(data):
    x, w = data
    (a, sfa), (b, sfb) = quant.per_token_cast_to_fp8(x, True), quant.per_block_cast_to_fp8(w, True)
    expected = torch.empty(M, N)
    deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), expected)
    a_t, b_t = (a.t().contiguous(), sfa.t().contiguous()), (b.t().contiguous(), sfb.t().contiguous())
    for fn, x_arg, w_arg in [
        (deep_gemm.fp8_gemm_nn, (a, sfa), b_t),
        (deep_gemm.fp8_gemm_tn, a_t, b_t),
        (deep_gemm.fp8_fp4_gemm_tt, a_t, (b, sfb)),
    ]:
        d = torch.empty(M, N)
        fn(x_arg, w_arg, d)
        assert torch.equal(d, expected), fn.__name__


@pytest.mark.parametrize("fp4_dtype", [torch.int8, torch.uint8, torch.float4_e2m1fn_x2])
def test_fp8_fp4_with_packed_scales(fp4_dtype):
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(M, 512, generator=g), torch.randn(N, 512, generator=g)  # 4 scales of 128: packable
    a, sfa = quant.per_token_cast_to_fp8(x, True, gran_k=128)
    b, sfb = quant.per_token_cast_to_fp4(w, True, gran_k=32)
    packed_sfa, packed_sfb = quant.pack_ue8m0_to_int(sfa), quant.pack_ue8m0_to_int(sfb)
    reference = fp8_gemm(a, sfa, b.view(torch.uint8), sfb, recipe_a=(1, 128), recipe_b=(1, 32))
    for sa, sb in [
        (sfa, sfb),
        (packed_sfa, packed_sfb),
        (quant.pack_ue8m0_to_int16(sfa), quant.pack_ue8m0_to_int16(sfb)),
    ]:
        d = torch.empty(M, N, dtype=torch.bfloat16)
        deep_gemm.fp8_fp4_gemm_nt((a, sa), (b.view(fp4_dtype), sb), d, recipe_a=(1, 128), recipe_b=(1, 32))
        assert torch.equal(d, reference), sa.dtype
    assert calc_diff(reference, x.double() @ w.double().T) < 1e-2


def test_transposed_fp4_operand_is_repacked(data):
    x, w = data
    a, sfa = quant.per_token_cast_to_fp4(x, True, gran_k=32)
    b, sfb = quant.per_token_cast_to_fp4(w, True, gran_k=32)
    expected, got = torch.empty(M, N), torch.empty(M, N)
    deep_gemm.fp8_fp4_gemm_nt((a, sfa), (b, sfb), expected, recipe=(1, 1, 32))
    b_kn = quant.transpose_packed_fp4(b)  # B given as [K, N/2], packed along N
    deep_gemm.fp8_fp4_gemm_nn((a, sfa), (b_kn, sfb.t()), got, recipe=(1, 1, 32))
    assert torch.equal(got, expected)


def test_accumulate_alpha_and_epilogue(data):
    x, w = data
    a, b = quant.per_token_cast_to_fp8(x, True), quant.per_token_cast_to_fp8(w, True)
    d = torch.randn(M, N)
    before = d.clone()
    deep_gemm.fp8_gemm_nt(a, b, d, c=d, recipe=(1, 1, 128), epilogue=deep_gemm.epilogue.Alpha(0.25))
    expected = before + fp8_gemm(*a, *b, recipe_a=(1, 128), recipe_b=(1, 128), alpha=0.25, out_dtype=torch.float32)
    assert torch.allclose(d, expected, rtol=1e-6, atol=1e-5)


def test_bad_inputs(data):
    x, w = data
    a, b = quant.per_token_cast_to_fp8(x, True), quant.per_block_cast_to_fp8(w, True)
    b4 = quant.per_token_cast_to_fp4(w, True, gran_k=32)
    a4 = quant.per_token_cast_to_fp4(x, True, gran_k=32)
    d = torch.empty(M, N)
    with pytest.raises(ValueError, match=r"argument 'recipe' value: expected None when recipe_a/recipe_b"):
        deep_gemm.fp8_gemm_nt(a, b, d, recipe=(1, 128, 128), recipe_a=(1, 128))
    with pytest.raises(ValueError, match=r"argument 'recipe_b' value: expected given together"):
        deep_gemm.fp8_gemm_nt(a, b, d, recipe_a=(1, 128))
    with pytest.raises(TypeError, match=r"argument 'a': expected a \(data, scale factors\) tuple"):
        deep_gemm.fp8_gemm_nt(a[0], b, d)
    with pytest.raises(ValueError, match=r"FP4 x FP8 is unsupported"):
        deep_gemm.fp8_fp4_gemm_nt(a4, b, d, recipe_a=(1, 32), recipe_b=(128, 128))
    with pytest.raises(ValueError, match=r"argument 'd' stride\(-1\)"):
        deep_gemm.fp8_gemm_nt(a, b, torch.empty(N, M).t())
    with pytest.raises(ValueError, match=r"argument 'sfb' shape"):
        deep_gemm.fp8_fp4_gemm_nt(a, b4, d, recipe_a=(1, 128), recipe_b=(1, 128))
    # Mismatched packings: a packed scale count that does not cover K, and two packings in one call.
    x512 = torch.randn(M, 512)
    a8, sfa8 = quant.per_token_cast_to_fp8(x512, True, gran_k=32)  # 16 scales per row
    b8, sfb8 = quant.per_token_cast_to_fp8(torch.randn(N, 512), True, gran_k=32)
    with pytest.raises(ValueError, match=r"argument 'sfa' shape: expected \[16, 16\]"):
        deep_gemm.fp8_gemm_nt((a8, quant.pack_ue8m0_to_int(sfa8[:, :8])), (b8, sfb8), d, recipe=(1, 1, 32))
    with pytest.raises(ValueError, match=r"argument 'sfb' dtype: expected torch.int32 \(the same UE8M0 packing"):
        deep_gemm.fp8_gemm_nt(
            (a8, quant.pack_ue8m0_to_int(sfa8)), (b8, quant.pack_ue8m0_to_int16(sfb8)), d, recipe=(1, 1, 32)
        )


def _dequantized(data, sf, block, k):
    """FP64 ``data * scale`` with ``block = (gran_mn, gran_k)`` scales, the last K block partial."""
    scale = sf.double().repeat_interleave(block[0], 0)[: data.shape[0]].repeat_interleave(block[1], 1)[:, :k]
    return data.double() * scale


def test_partial_last_k_block_as_upstream():
    """K not a multiple of the scale block (the dgrad of DeepSeek's 2112-wide projection: K = 2112 with 1x128 and
    128x128 scales; DeepGEMM's own test_gemm runs it): upstream's kernels read a partial last block, and so do we
    (the operands zero-padded to whole blocks, which changes no sum)."""
    g = torch.Generator().manual_seed(2)
    k = 320
    x, w = torch.randn(M, k, generator=g), torch.randn(N, k, generator=g)
    (a, sfa), (b, sfb) = quant.per_token_cast_to_fp8(x, False), quant.per_block_cast_to_fp8(w, False)
    assert sfa.shape == (M, 3) and sfb.shape == (1, 3)
    d = torch.empty(M, N)
    deep_gemm.fp8_gemm_nt((a, sfa), (b, sfb), d)
    expected = _dequantized(a, sfa, (1, 128), k) @ _dequantized(b, sfb, (128, 128), k).T
    assert calc_diff(d, expected) < 1e-12
    # MN-major operands through the layout aliases: the same result
    d_tn = torch.empty(M, N)
    deep_gemm.fp8_gemm_tn((a.t().contiguous(), sfa.t().contiguous()), (b.t().contiguous(), sfb.t().contiguous()), d_tn)
    assert torch.equal(d_tn, d)
    # FP8 x FP4 with different K blocks (1x128 and 1x32): K = 352 is whole for b, partial for a
    k = 352
    x, w = torch.randn(M, k, generator=g), torch.randn(N, k, generator=g)
    a, sfa = quant.per_token_cast_to_fp8(x, True, gran_k=128)
    b, sfb = quant.per_token_cast_to_fp4(w, True, gran_k=32)
    d = torch.empty(M, N)
    deep_gemm.fp8_fp4_gemm_nt((a, sfa), (b, sfb), d, recipe_a=(1, 128), recipe_b=(1, 32))
    k_pad = 384  # the reference: the padded operands through the op itself
    a_pad = torch.zeros(M, k_pad, dtype=a.dtype)
    a_pad[:, :k] = a
    b_pad = torch.zeros(N, k_pad // 2, dtype=torch.uint8)
    b_pad[:, : k // 2] = b.view(torch.uint8)
    sfa_pad = sfa.float()  # 3 blocks of 128 cover 384
    sfb_pad = torch.cat([sfb.float(), torch.ones(N, 1)], 1)  # the 12th block of 32: padding only
    wide = fp8_gemm(a_pad, sfa_pad, b_pad, sfb_pad, recipe_a=(1, 128), recipe_b=(1, 32), out_dtype=torch.float32)
    assert torch.equal(d, wide)
