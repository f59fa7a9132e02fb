"""The scaled GEMMs on every memory layout of their operands (issue 14.1): the CPU kernels pick a path from
strides (streaming for few rows of A, panels otherwise), so each layout must give the same product. Size-1
dims, stride 0 (expand), sliced and transposed views of already quantized data, on the eager C++ kernels
and the portable ones, against an fp64 product of the dequantized operands."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fp8_gemm.specs import _FORMATS, quantize
from tests.grouped.specs import psum_layout
from torch_ascend_moe import quant
from torch_ascend_moe.backends.portable import fp8_gemm as portable
from torch_ascend_moe.backends.portable import grouped as portable_grouped
from torch_ascend_moe.testing import calc_diff

ops = torch.ops.ascend_moe  # the eager C++ kernels on CPU

# Packed FP4 must be K-major, so its layouts keep a unit K stride.
_FP8_LAYOUTS = ("contiguous", "mn_major", "sliced", "expand_rows", "expand_k")
_FP4_LAYOUTS = ("contiguous", "sliced_rows", "expand_rows")
_SCALE_LAYOUTS = ("contiguous", "mn_major", "sliced")


def restride(x: torch.Tensor, layout: str) -> torch.Tensor:
    """``x``'s values in another memory layout (the expand layouts repeat its first row or column)."""
    r, c = x.shape[-2:]
    bytes_ = x.view(torch.uint8) if x.element_size() == 1 else x
    if layout == "mn_major":
        out = bytes_.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif layout in ("sliced", "sliced_rows"):
        col_step = 3 if layout == "sliced" else 1
        big = torch.zeros(*x.shape[:-2], 2 * r + 1, col_step * c + 1, dtype=bytes_.dtype)
        out = big[..., 1::2, 1::col_step][..., :r, :c]
        out.copy_(bytes_)
    elif layout == "expand_rows":
        out = bytes_[..., :1, :].expand(bytes_.shape)
    elif layout == "expand_k":
        out = bytes_[..., :1].expand(bytes_.shape)
    else:
        out = bytes_
    return out.view(x.dtype) if x.element_size() == 1 else out


def deq64(x: torch.Tensor, sf: torch.Tensor, recipe) -> torch.Tensor:
    """fp64 ``x[..., r, k] * sf[..., r // gran_mn, k // gran_k]``, the values decoded by PyTorch's casts."""
    values = quant.decode_e2m1(quant.unpack_e2m1(x)) if x.dtype == torch.uint8 else x.float()
    gmn, gk = recipe
    scales = sf.double().repeat_interleave(gmn, dim=-2)[..., : values.shape[-2], :]
    return values.double() * scales.repeat_interleave(gk, dim=-1)


def assert_exact_product(out: torch.Tensor, a64: torch.Tensor, b64: torch.Tensor) -> None:
    """FP32 output of quantized inputs: within FP32 accumulation error of the fp64 product, entry by entry."""
    ref = a64 @ b64.transpose(-1, -2)
    bound = 1e-5 * (a64.abs() @ b64.abs().transpose(-1, -2))
    assert out.dtype == torch.float32 and out.shape == ref.shape
    assert ((out.double() - ref).abs() <= bound).all(), (out, ref)
    assert calc_diff(out, ref) < 1e-6  # design §5: already-quantized inputs


@st.composite
def operands(draw, batch: int | None = None):
    """(a, sfa, recipe_a, b, sfb, recipe_b) quantized in one of the formats, then restrided."""
    _, fa, fb = _FORMATS[draw(st.integers(0, len(_FORMATS) - 1))]
    k = max(fa[2], fb[2]) * draw(st.integers(1, 2))
    m, n = draw(st.integers(1, 10)), draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    lead = () if batch is None else (batch,)
    out = []
    for rows, fmt in ((m, fa), (n, fb)):
        x = torch.randn(*lead, rows, k, generator=g)
        parts = [quantize(xi, fmt) for xi in (x.unbind(0) if lead else [x])]
        data = torch.stack([p[0] for p in parts]) if lead else parts[0][0]
        sf = torch.stack([p[1] for p in parts]) if lead else parts[0][1]
        layouts = _FP4_LAYOUTS if data.dtype == torch.uint8 else _FP8_LAYOUTS
        data = restride(data, draw(st.sampled_from(layouts)))
        sf = restride(sf, draw(st.sampled_from(_SCALE_LAYOUTS)))
        if lead and draw(st.booleans()):  # stride 0 over the batch
            data, sf = data[:1].expand(data.shape), sf[:1].expand(sf.shape)
        out += [data, sf, parts[0][2]]
    return tuple(out)


def test_issue_repro_one_strided_row_of_b():
    a = torch.randn(2, 128).to(torch.float8_e4m3fn)
    b = torch.randn(1, 256).to(torch.float8_e4m3fn)[:, ::2]
    out = ops.fp8_gemm(a, torch.ones(2, 1), b, torch.ones(1, 1), None, [1, 128], [128, 128], 1.0, torch.float32)
    assert_exact_product(out, a.double(), b.double())


@settings(max_examples=50, deadline=None)
@given(case=operands())
def test_fp8_gemm_any_layout(case):
    a, sfa, ra, b, sfb, rb = case
    a64, b64 = deq64(a, sfa, ra), deq64(b, sfb, rb)
    for fn in (ops.fp8_gemm, portable.fp8_gemm):
        assert_exact_product(fn(a, sfa, b, sfb, None, ra, rb, 1.0, torch.float32), a64, b64)


@settings(max_examples=30, deadline=None)
@given(case=operands(batch=2))
def test_fp8_bmm_any_layout(case):
    a, sfa, ra, b, sfb, rb = case
    a64, b64 = deq64(a, sfa, ra), deq64(b, sfb, rb)
    for fn in (ops.fp8_bmm, portable.fp8_bmm):
        assert_exact_product(fn(a, sfa, b, sfb, None, ra, rb, 1.0, torch.float32), a64, b64)


@settings(max_examples=30, deadline=None)
@given(case=operands(batch=2), split=st.integers(0, 10))
def test_m_grouped_fp8_gemm_any_layout(case, split):
    """Group 0 takes the first rows of A, group 1 the rest: each group sees few rows (the streaming path)."""
    a, sfa, ra, b, sfb, rb = case
    a, sfa = a[0], sfa[0]  # A is [M, K] here; its batch layouts become row layouts
    m = a.shape[0]
    layout, _ = psum_layout([min(split, m), m - min(split, m)], 1)
    a64, b64 = deq64(a, sfa, ra), deq64(b, sfb, rb)
    ends = [0, *layout.tolist()]
    for fn in (ops.m_grouped_fp8_gemm, portable_grouped.m_grouped_fp8_gemm):
        out = fn(a, sfa, b, sfb, layout, True, 1, ra, rb, torch.float32)
        for grp in range(2):
            rows = slice(ends[grp], ends[grp + 1])
            assert_exact_product(out[rows], a64[rows], b64[grp])
