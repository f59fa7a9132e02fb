"""BF16 GEMMs keep FP32's subnormal range: on CPUs with BF16 dot products the C++ kernels hand BF16 results to
ATen's BF16 GEMM, whose instructions flush subnormal operands and products to zero; a scan of the operands'
smallest magnitudes keeps every call with a product below FP32's normal range on the exact FP32 path (gemm, bmm /
einsum, m-grouped, the fused SwiGLU L1). On other CPUs the FP32 path is the only one: the same results."""

from __future__ import annotations

import pytest
import torch

from torch_ascend_moe.ops.gemm import bf16_bmm, bf16_gemm
from torch_ascend_moe.ops.grouped import m_grouped_bf16_gemm


def _exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.double() @ b.double().transpose(-1, -2)).bfloat16()


@pytest.mark.parametrize(
    ("a_value", "b_value"),
    [(1e-39, 1.0), (-1e-39, 3.0), (1.0, 2e-39), (1e-20, 1e-20), (-3e-21, 2e-19)],
    ids=["subnormal a", "negative subnormal a", "subnormal b", "tiny products", "tiny mixed"],
)
def test_products_below_fp32_normal_range_are_not_flushed(a_value, b_value):
    g = torch.Generator().manual_seed(0)
    a = (torch.rand(16, 64, generator=g) + 0.5).mul(a_value).bfloat16()
    b = (torch.rand(24, 64, generator=g) + 0.5).mul(b_value).bfloat16()
    want = _exact(a, b)
    assert want.abs().min() > 0  # the exact result is representable: a flushed product would show
    torch.testing.assert_close(bf16_gemm(a, b), want, rtol=2**-7, atol=0)
    torch.testing.assert_close(
        bf16_bmm(a[None].expand(3, 16, 64), b[None].expand(3, 24, 64))[1], want, rtol=2**-7, atol=0
    )
    offs = torch.tensor([5, 16], dtype=torch.int32)
    grouped = m_grouped_bf16_gemm(a, torch.stack([b, b]), offs)
    torch.testing.assert_close(grouped, want, rtol=2**-7, atol=0)


def test_normal_operands_match_fp64_within_an_ulp():
    """Whichever path runs (ATen's BF16 GEMM here when the CPU has BF16 dot products), FP32 accumulation and one
    rounding: within one BF16 ulp of the correctly rounded product, C joining the same sum."""
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 512, generator=g).bfloat16(), torch.randn(96, 512, generator=g).bfloat16()
    c = torch.randn(64, 96, generator=g).bfloat16() * 30
    exact = a.double() @ b.double().t() + c.double()
    got = bf16_gemm(a, b, c)
    assert ((got.double() - exact).abs() <= exact.abs() * 2**-8 + 1e-30).all()


def test_remembered_weight_verdict_follows_in_place_changes():
    """B's scan is remembered per view and version: a weight called again is not rescanned, an in-place change to
    subnormal values (a new version) is, and a view of other rows (another offset) has its own verdict."""
    g = torch.Generator().manual_seed(2)
    a = (torch.rand(16, 64, generator=g) + 0.5).bfloat16()
    w = (torch.rand(48, 64, generator=g) + 0.5).bfloat16()
    torch.testing.assert_close(bf16_gemm(a, w), _exact(a, w), rtol=2**-7, atol=0)
    with torch.no_grad():
        w[24:].mul_(2e-39)  # subnormal rows: the old verdict ("normal") must not be reused
    assert _exact(a, w)[:, 24:].abs().min() > 0
    torch.testing.assert_close(bf16_gemm(a, w), _exact(a, w), rtol=2**-7, atol=0)
    top, bottom = w[:24], w[24:]
    torch.testing.assert_close(bf16_gemm(a, top), _exact(a, top), rtol=2**-7, atol=0)
    torch.testing.assert_close(bf16_gemm(a, bottom), _exact(a, bottom), rtol=2**-7, atol=0)
    offs = torch.tensor([7, 16], dtype=torch.int32)
    grouped_w = torch.stack([top, bottom])
    want = torch.cat([_exact(a[:7], top), _exact(a[7:], bottom)])
    for _ in range(2):  # the second call takes the remembered verdicts
        torch.testing.assert_close(m_grouped_bf16_gemm(a, grouped_w, offs), want, rtol=2**-7, atol=0)


def test_inference_tensors_are_scanned_every_call():
    """Inference tensors have no version counter, so their verdict is not remembered: an in-place change inside
    inference mode is still seen."""
    g = torch.Generator().manual_seed(3)
    with torch.inference_mode():
        a = (torch.rand(16, 64, generator=g) + 0.5).bfloat16()
        w = (torch.rand(24, 64, generator=g) + 0.5).bfloat16()
        torch.testing.assert_close(bf16_gemm(a, w), _exact(a, w), rtol=2**-7, atol=0)
        w.mul_(2e-39)
        torch.testing.assert_close(bf16_gemm(a, w), _exact(a, w), rtol=2**-7, atol=0)
