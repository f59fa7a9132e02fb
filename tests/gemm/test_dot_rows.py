"""Few rows against a K-major B on a CPU with AVX512-BF16: `gemm_dot_bf16.cpp`'s row kernel (one VDPBF16PS dot
product per output element, B read straight from memory with its rows prefetched into L2), which takes BF16 GEMMs
of up to 16 rows there (decode rows, the small experts of a grouped GEMM). Its contract: FP32 sums and one rounding,
as every path; each element's bits depend on its own row of A and row of B only, so the same row gives the same
bits alone or in a batch, at any thread count, in any column block, through the dense and the grouped ops.
Checked only where the CPU executes the instruction; elsewhere these calls take the paths the other tests check."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_ascend_moe import _C
from torch_ascend_moe.ops.gemm import bf16_gemm
from torch_ascend_moe.ops.grouped import m_grouped_bf16_gemm
from torch_ascend_moe.testing import at_threads

pytestmark = pytest.mark.skipif(
    not torch.cpu._is_avx512_bf16_supported(), reason="the row kernel runs only where the CPU has AVX512-BF16"
)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def _operand(rows, k, pad, scale, g):
    """rows x k BF16 values spread over +-scale * 2^(+-6), stored with `pad` extra columns (row stride k + pad)."""
    mag = torch.exp2(torch.randint(-6, 7, (rows, k + pad), generator=g).float())
    full = (torch.randn(rows, k + pad, generator=g) * mag * scale).bfloat16()
    return full[:, :k]


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 16),
    n=st.integers(1, 70),
    k=st.integers(1, 300),
    pads=st.tuples(st.sampled_from([0, 3, 32]), st.sampled_from([0, 1, 64])),
    out_fp32=st.booleans(),
    with_c=st.booleans(),
    alpha=st.sampled_from([1.0, 0.5, -3.0]),
    seed=st.integers(0, 2**16),
)
def test_sums_match_fp64_and_each_row_is_its_own(m, n, k, pads, out_fp32, with_c, alpha, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = _operand(m, k, pads[0], 1.0, g), _operand(n, k, pads[1], 3.0, g)
    out_dtype = torch.float32 if out_fp32 else torch.bfloat16
    c = (torch.randn(m, n, generator=g) * 40).to(out_dtype) if with_c else None
    got = bf16_gemm(a, b, c, alpha=alpha, out_dtype=out_dtype)

    # FP32 accumulation of exact products, one rounding: within K FP32 ulps of the sum of magnitudes, plus the output
    # dtype's half ulp.
    exact = alpha * (a.double() @ b.double().t()) + (c.double() if with_c else 0.0)
    magnitude = abs(alpha) * (a.double().abs() @ b.double().abs().t()) + (c.double().abs() if with_c else 0.0)
    unit = 2.0**-24 if out_fp32 else 2.0**-8
    bound = exact.abs() * unit + magnitude * (k + 2) * 2.0**-24 + 1e-30
    assert ((got.double() - exact).abs() <= bound).all()

    # Each row alone, at two threads, and a column block starting elsewhere: the same bits.
    for r in range(m):
        alone = bf16_gemm(a[r : r + 1], b, c[r : r + 1] if with_c else None, alpha=alpha, out_dtype=out_dtype)
        assert torch.equal(_bits(alone), _bits(got[r : r + 1])), r
    two = at_threads(2, lambda: bf16_gemm(a, b, c, alpha=alpha, out_dtype=out_dtype))
    assert torch.equal(_bits(two), _bits(got))
    j = n // 3
    shifted = bf16_gemm(a, b[j:], c[:, j:] if with_c else None, alpha=alpha, out_dtype=out_dtype)
    assert torch.equal(_bits(shifted), _bits(got[:, j:]))


def test_grouped_experts_of_few_rows_are_the_dense_rows():
    """A grouped call's experts of up to 16 rows (and one above, on oneDNN's path) give their rows' dense bits."""
    g = torch.Generator().manual_seed(3)
    rows = [1, 16, 0, 5, 40, 2, 16, 9]
    offs = torch.tensor(rows).cumsum(0).int()
    x, w = _operand(sum(rows), 200, 0, 1.0, g), _operand(len(rows) * 96, 200, 0, 1.0, g).view(len(rows), 96, 200)
    for threads in (1, 2):
        got = at_threads(threads, lambda: m_grouped_bf16_gemm(x, w, offs))
        start = 0
        for e, count in enumerate(rows):
            want = bf16_gemm(x[start : start + count], w[e])
            assert torch.equal(_bits(got[start : start + count]), _bits(want)), (threads, e)
            start += count


def test_nan_and_inf_propagate():
    g = torch.Generator().manual_seed(4)
    a, b = _operand(5, 77, 0, 1.0, g), _operand(33, 77, 0, 1.0, g)
    a[1, 70] = float("nan")  # in the K tail: a masked load
    a[3, 5] = float("inf")
    b[7, 40] = float("-inf")
    exact = (a.double() @ b.double().t()).bfloat16()
    got = bf16_gemm(a, b)
    assert torch.equal(got.isnan(), exact.isnan())
    assert torch.equal(got.isinf(), exact.isinf())
    assert torch.equal(got[got.isinf()], exact[exact.isinf()])


def test_turned_off_with_the_native_paths():
    """set_native_bf16_dot(0) takes these calls back to the FP32 panels / streaming kernel (the other CPUs' paths):
    the same sums within the contract, other bits in general."""
    g = torch.Generator().manual_seed(5)
    a, b = _operand(9, 512, 0, 1.0, g), _operand(64, 512, 0, 1.0, g)
    previous = _C._set_native_bf16_dot(0)
    try:
        off = bf16_gemm(a, b, out_dtype=torch.float32)
    finally:
        _C._set_native_bf16_dot(previous)
    on = bf16_gemm(a, b, out_dtype=torch.float32)
    exact = a.double() @ b.double().t()
    magnitude = a.double().abs() @ b.double().abs().t()
    for got in (on, off):
        assert ((got.double() - exact).abs() <= magnitude * 514 * 2.0**-24).all()
