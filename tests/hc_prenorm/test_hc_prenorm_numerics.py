"""hc_prenorm_gemm: DeepGEMM's test shapes (scaled), the split rule, TF32 rounding, compat, repeatability."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from tests.hc_prenorm.specs import reference
from torch_ascend_moe import hc_prenorm_gemm
from torch_ascend_moe.quant import round_to_tf32
from torch_ascend_moe.testing import calc_diff


def test_tf32_rounding_ties_away_from_zero():
    one_ulp = 2.0**-10  # TF32 keeps 10 mantissa bits
    x = torch.tensor([1 + one_ulp / 2, 1 + one_ulp / 4, -(1 + one_ulp / 2), 1 + 3 * one_ulp / 4, float("inf")])
    expected = torch.tensor([1 + one_ulp, 1.0, -(1 + one_ulp), 1 + one_ulp, float("inf")])
    assert torch.equal(round_to_tf32(x), expected)
    nan = round_to_tf32(torch.tensor([float("nan")]))
    assert torch.isnan(nan).all()


@pytest.mark.parametrize("m", [13, 137])
@pytest.mark.parametrize("k", [7168, 7680])
@pytest.mark.parametrize("num_splits", [None, 16])
def test_deepgemm_shapes(m, k, num_splits):
    g = torch.Generator().manual_seed(m + k)
    a, b = torch.randn(m, k, generator=g).bfloat16(), torch.randn(24, k, generator=g)
    d, sqr = hc_prenorm_gemm(a, b, num_splits=num_splits)
    ref_d, ref_sqr = reference(a, b, num_splits)
    assert max(calc_diff(d, ref_d), calc_diff(sqr, ref_sqr)) < 1e-8  # DeepGEMM's threshold
    if num_splits is not None:  # the partials add up to the unsplit result
        full_d, full_sqr = hc_prenorm_gemm(a, b)
        assert calc_diff(d.sum(0), full_d) < 1e-10 and calc_diff(sqr.sum(0), full_sqr) < 1e-10


def test_split_rule_and_empty_splits():
    a, b = torch.randn(2, 192, dtype=torch.bfloat16), torch.randn(8, 192)  # 3 blocks of 64 in 5 splits
    d, sqr = hc_prenorm_gemm(a, b, num_splits=5)
    for s in range(3):
        k0 = 64 * s
        torch.testing.assert_close(sqr[s], a[:, k0 : k0 + 64].float().square().sum(-1))
    assert (d[3:] == 0).all() and (sqr[3:] == 0).all()


def test_compat_and_repeatability():
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(37, 1024, generator=g).bfloat16(), torch.randn(24, 1024, generator=g)
    d, sqr = torch.empty(16, 37, 24), torch.empty(16, 37)
    deep_gemm.tf32_hc_prenorm_gemm(a, b, d, sqr, num_splits=16)
    d2, sqr2 = torch.empty_like(d), torch.empty_like(sqr)
    deep_gemm.tf32_hc_prenorm_gemm(a, b, d2, sqr2, num_splits=16)
    assert torch.equal(d, d2) and torch.equal(sqr, sqr2)  # bitwise repeatable
    expected = hc_prenorm_gemm(a, b, num_splits=16)
    assert torch.equal(sqr, expected[1])
    # On CPU the compat computes the plain FP32 product: what DeepGEMM's test compares with there (`a.float() @ b.T`
    # under allow_tf32, which CPU GEMMs ignore), to its 1e-8; the op's TF32-rounded b is ~2e-8 from it.
    reference = a.float() @ b.T
    assert calc_diff(d.sum(0), reference) < 1e-12 < calc_diff(expected[0].sum(0), reference)
    d_whole, sqr_whole = torch.empty(37, 24), torch.empty(37)
    deep_gemm.tf32_hc_prenorm_gemm(a, b, d_whole, sqr_whole)
    assert torch.equal(d_whole, reference) and torch.equal(sqr_whole, a.float().square().sum(-1))
    with pytest.raises(ValueError, match=r"argument 'sqr_sum' shape: expected \[16, 37\]"):
        deep_gemm.tf32_hc_prenorm_gemm(a, b, d, torch.empty(37), num_splits=16)


def test_prenorm_identity_gives_rmsnorm_projection():
    """What mHC uses it for: RMSNorm(x) @ W^T == (x @ W^T) * rsqrt(mean(x^2) + eps)."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 256, generator=g), torch.randn(24, 256, generator=g)
    d, sqr = hc_prenorm_gemm(x, w)
    normed = d * torch.rsqrt(sqr / 256 + 1e-6).unsqueeze(-1)
    ref = torch.nn.functional.rms_norm(x, (256,), eps=1e-6) @ round_to_tf32(w).T
    torch.testing.assert_close(normed, ref, rtol=1e-5, atol=1e-5)
