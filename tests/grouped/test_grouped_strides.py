"""The BF16 grouped GEMMs on every memory layout of their operands (issue 14.1): each group runs the gemm
family's worker, which picks streaming or panel paths from strides. Size-1 dims, stride 0 (expand), sliced
and transposed views, on the eager C++ kernels and the portable ones, against the fp64 references."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.grouped.specs import k_grouped_reference, m_grouped_reference, psum_layout
from torch_ascend_moe.backends.portable import grouped as portable
from torch_ascend_moe.testing import calc_diff

ops = torch.ops.ascend_moe  # the eager C++ kernels on CPU
_LAYOUTS = ("contiguous", "mn_major", "sliced", "expand_rows", "expand_k")


def restride(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x``'s values over its last two dims in another memory layout (the expand layouts repeat its first
    row or column)."""
    r, c = x.shape[-2:]
    if layout == "mn_major":
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "sliced":
        big = torch.zeros(*x.shape[:-2], 2 * r + 1, 3 * c + 1, dtype=x.dtype)
        out = big[..., 1::2, 1::3][..., :r, :c]
        out.copy_(x)
        return out
    if layout == "expand_rows":
        return x[..., :1, :].expand(x.shape)
    if layout == "expand_k":
        return x[..., :1].expand(x.shape)
    return x


def assert_exact(out: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> None:
    """FP32 output of BF16 inputs: within FP32 accumulation error of the fp64 product, entry by entry."""
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert ((out.double() - ref).abs() <= 1e-5 * bound).all(), (out, ref)
    assert calc_diff(out, ref) < 1e-6  # design §5: exactly representable inputs


@st.composite
def grouped_case(draw):
    counts = draw(st.lists(st.integers(0, 9), min_size=1, max_size=3))
    alignment = draw(st.sampled_from([1, 4]))
    n, k = draw(st.integers(1, 5)), draw(st.integers(1, 40))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    layout, rows = psum_layout(counts, alignment)
    a = torch.randn(rows, k, generator=g).bfloat16()
    b = torch.randn(len(counts), n, k, generator=g).bfloat16()
    return restride(a, draw(st.sampled_from(_LAYOUTS))), restride(b, draw(st.sampled_from(_LAYOUTS))), layout, alignment


@settings(max_examples=40, deadline=None)
@given(case=grouped_case())
def test_m_grouped_bf16_gemm_any_layout(case):
    a, b, layout, alignment = case
    ref = m_grouped_reference(a, b, layout, True, alignment, None)
    bound = m_grouped_reference(a.abs(), b.abs(), layout, True, alignment, None)
    for fn in (ops.m_grouped_bf16_gemm, portable.m_grouped_bf16_gemm):
        assert_exact(fn(a, b, layout, True, alignment, torch.float32), ref, bound)


@settings(max_examples=30, deadline=None)
@given(case=grouped_case(), m=st.integers(1, 10))
def test_masked_bf16_gemm_any_layout(case, m):
    _, b, _, _ = case
    g = torch.Generator().manual_seed(m)
    a = restride(torch.randn(b.shape[0], m, b.shape[2], generator=g).bfloat16(), "sliced")
    masked_m = torch.randint(0, m + 1, (b.shape[0],), generator=g, dtype=torch.int32)
    ref = torch.einsum("gmk,gnk->gmn", a.double(), b.double())
    bound = torch.einsum("gmk,gnk->gmn", a.double().abs(), b.double().abs())
    live = torch.arange(m)[None, :, None] < masked_m[:, None, None].long()
    for fn in (ops.m_grouped_bf16_gemm_masked, portable.m_grouped_bf16_gemm_masked):
        out = fn(a, b, masked_m, torch.float32)
        assert_exact(out, torch.where(live, ref, 0), bound)


@settings(max_examples=40, deadline=None)
@given(case=grouped_case(), b_layout=st.sampled_from(_LAYOUTS))
def test_k_grouped_bf16_gemm_any_layout(case, b_layout):
    """a [K_total, M] and b [K_total, N]: the groups split the reduction rows."""
    a, w, layout, alignment = case
    g = torch.Generator().manual_seed(a.shape[0])
    b = restride(torch.randn(a.shape[0], w.shape[1], generator=g).bfloat16(), b_layout)
    groups = layout.numel()
    ref = k_grouped_reference(a, b, layout, groups, True, alignment, None, None)
    bound = k_grouped_reference(a.abs(), b.abs(), layout, groups, True, alignment, None, None)
    for fn in (ops.k_grouped_bf16_gemm, portable.k_grouped_bf16_gemm):
        assert_exact(fn(a, b, layout, groups, True, alignment, None, torch.float32), ref, bound)


def test_k_grouped_output_is_row_major_whatever_c_is():
    """The kernels' output layout is the fake's (row-major) also when the accumulator c is column-major."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_ascend_moe.backends.portable import grouped as portable

    a, b = torch.randn(8, 6).bfloat16(), torch.randn(8, 5).bfloat16()
    layout = torch.tensor([4, 8], dtype=torch.int32)
    c = torch.randn(2, 5, 6).transpose(1, 2)
    with FakeTensorMode() as mode:
        fake = torch.ops.ascend_moe.k_grouped_bf16_gemm(
            *(mode.from_tensor(t) for t in (a, b, layout)), 2, True, 1, mode.from_tensor(c), None
        )
    for out in (
        torch.ops.ascend_moe.k_grouped_bf16_gemm(a, b, layout, 2, True, 1, c, None),
        portable.k_grouped_bf16_gemm(a, b, layout, 2, True, 1, c, None),
    ):
        assert out.stride() == fake.stride() == (30, 5, 1)
