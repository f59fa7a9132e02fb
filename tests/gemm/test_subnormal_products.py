"""BF16 GEMMs keep FP32's subnormal range: on CPUs with BF16 dot products the C++ kernels hand BF16 results to
ATen's BF16 GEMM, whose instructions flush subnormal operands and products to zero; a scan of the operands'
smallest magnitudes keeps every call with a product below FP32's normal range on the exact FP32 path (gemm, bmm /
einsum, m-grouped, the fused SwiGLU L1). On other CPUs the FP32 path is the only one: the same results."""

from __future__ import annotations

import pytest
import torch

from torch_ascend_moe import _C
from torch_ascend_moe.ops.gemm import bf16_bmm, bf16_gemm
from torch_ascend_moe.ops.grouped import k_grouped_bf16_gemm, m_grouped_bf16_gemm


@pytest.fixture(autouse=True, params=["this CPU", "forced native"])
def paths(request):
    """Every test on the path this CPU takes, and on the paths of a CPU with BF16 dot products (ATen's BF16 GEMM for
    BF16 results; for FP32 ones our AVX512-BF16 kernel where the CPU has the instruction, else MKL's BF16 GEMM),
    forced: on a CPU without them ATen and MKL emulate BF16, so the choices and the layouts handed to them are checked
    on every machine (the flushing itself only where the instructions are)."""
    previous = _C._set_native_bf16_dot(1 if request.param == "forced native" else -1)
    yield request.param
    _C._set_native_bf16_dot(previous)


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


def _fp32_close(got: torch.Tensor, exact: torch.Tensor, k: int) -> None:
    """FP32 accumulation of ``k`` exact products: within k * 2^-24 of the sum of magnitudes (any summation order)."""
    assert got.dtype == torch.float32
    finite = exact.isfinite()
    bound = (k + 2) * 2**-24 * exact[finite].abs().max().clamp_min(1e-30) * 8
    assert torch.equal(got.isnan(), exact.isnan())
    assert torch.equal(got[~finite & ~exact.isnan()], exact[~finite & ~exact.isnan()].float())
    assert ((got[finite].double() - exact[finite]).abs() <= bound).all()


@pytest.mark.parametrize("layout", ["a row-major", "a column-major", "b column-major", "b broadcast rows"])
def test_fp32_results_of_bf16_operands(layout):
    """FP32 outputs of BF16 GEMMs (the native kernel on a CPU with BF16 dot products, FP32 panels elsewhere) in every
    majorness CBLAS takes and one it does not (a broadcast operand), C joining the FP32 sum: FP64 within FP32's
    accumulation error."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(40, 96, generator=g).bfloat16(), torch.randn(56, 96, generator=g).bfloat16()
    if layout == "a column-major":
        a = a.t().contiguous().t()
    elif layout == "b column-major":
        b = b.t().contiguous().t()
    elif layout == "b broadcast rows":
        b = b[:1].expand(56, 96)
    c = torch.randn(40, 56, generator=g) * 10
    exact = a.double() @ b.double().t()
    _fp32_close(bf16_gemm(a, b, out_dtype=torch.float32), exact, 96)
    _fp32_close(bf16_gemm(a, b, c, alpha=0.5), 0.5 * exact + c.double(), 96)


def test_grouped_weight_gradient_fp32():
    """k_grouped_bf16_gemm's FP32 output (transposed segments of A and B, C accumulated): FP64 within FP32's error,
    NaN and inf where a segment holds them, empty experts zero (or C)."""
    g = torch.Generator().manual_seed(4)
    counts = [24, 0, 40, 8]
    a, b = torch.randn(72, 48, generator=g).bfloat16(), torch.randn(72, 32, generator=g).bfloat16()
    a[30, 5], b[70, 3] = float("nan"), float("inf")
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).int()
    c = torch.randn(4, 48, 32, generator=g)
    got = k_grouped_bf16_gemm(a, b, offs, 4, c=c)
    begin, exact = 0, c.double().clone()
    for e, end in enumerate(offs.tolist()):
        exact[e] += a[begin:end].double().t() @ b[begin:end].double()
        begin = end
    _fp32_close(got, exact, 40)


@pytest.mark.parametrize(("m", "n", "k"), [(13, 70, 1101), (16, 64, 512), (40, 33, 3), (1, 5, 2)])
@pytest.mark.parametrize("majorness", ["row-major", "column-major"])
def test_fp32_results_across_tiles_and_chunks(m, n, k, majorness):
    """The FP32 results of BF16 operands on a CPU with AVX512-BF16 (our VDPBF16PS kernel: 8 x 32 tiles, the
    reduction in chunks of 256 pairs, operands packed in pairs): edge tiles, an odd reduction length, several chunks,
    C joining the sum, NaN / inf in an edge row and column, in both majornesses; FP64 within FP32's error."""
    g = torch.Generator().manual_seed(m * n + k)
    a, b = torch.randn(m, k, generator=g).bfloat16(), torch.randn(n, k, generator=g).bfloat16()
    if m > 1 and n > 1:
        a[m - 1, k // 2], b[n - 1, 0] = float("inf"), float("nan")
    if majorness == "column-major":
        a, b = a.t().contiguous().t(), b.t().contiguous().t()
    c = torch.randn(m, n, generator=g)
    exact = a.double() @ b.double().t()
    _fp32_close(bf16_gemm(a, b, out_dtype=torch.float32), exact, k)
    _fp32_close(bf16_gemm(a, b, c), exact + c.double(), k)


def test_mkl_bf16_gemm_is_linked_on_x86():
    """PyTorch's x86 wheels link MKL statically and export its BF16 GEMM: the native FP32 path exists there."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("MKL is linked into PyTorch's x86 wheels only")
    assert _C._mkl_bf16_gemm()


@pytest.mark.parametrize("layout", ["NT", "NN", "TT"])
def test_native_results_are_atens_own_bits(layout, paths):
    """Forced native (normal products), a BF16 result is ATen's BF16 GEMM's, bit for bit, whatever the layouts, with
    and without C and alpha."""
    if paths != "forced native":
        pytest.skip("the native path only")
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(48, 320, generator=g).bfloat16(), torch.randn(80, 320, generator=g).bfloat16()
    if layout in ("NN", "TT"):
        b = b.t().contiguous().t()  # B stored [K, N]
    if layout == "TT":
        a = a.t().contiguous().t()
    c = torch.randn(48, 80, generator=g).bfloat16()
    assert torch.equal(bf16_gemm(a, b).view(torch.int16), torch.mm(a, b.t()).view(torch.int16))
    want = torch.addmm(c, a, b.t(), alpha=0.5)
    assert torch.equal(bf16_gemm(a, b, c, alpha=0.5).view(torch.int16), want.view(torch.int16))
