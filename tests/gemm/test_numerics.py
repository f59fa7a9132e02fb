"""Numerics of the gemm family on DeepGEMM's own shape grid (specs §14.2, scaled for a CPU) and on
random shapes, through the compat entry points and their layout aliases, against fp64."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_ascend_moe.deep_gemm as deep_gemm
from tests.gemm.specs import make_operand
from torch_ascend_moe import bf16_gemm
from torch_ascend_moe.testing import calc_diff

BF16_THRESHOLD = 1e-5  # DeepGEMM's BF16 GEMM threshold
EXACT_THRESHOLD = 1e-6  # FP32 output from exactly representable BF16 inputs (design §5)

# enumerate_normal's (N, K) list, N and K divided so a 2-core CPU runs it in seconds; N keeps its tails
# (576, and 129280's vocab-like 4040 = 129280 / 32).
_NK = [(528, 448), (576, 448), (1536, 384), (1024, 512), (896, 1024), (512, 448), (896, 256), (256, 448), (4040, 448)]
_M = [1, 128, 1024]


def _forward_cases():
    for m in _M:
        for n, k in _NK:
            yield m, n, k, torch.bfloat16, False
            yield m, n, k, torch.bfloat16, True  # accumulate: c = d = 32 * randn
        yield m, 256, 448, torch.float32, False
        yield m, 4040, 448, torch.float32, False


def _layouts(a, b):
    """The argument forms of every alias for logical a[M, K], b[N, K]."""
    return {
        "nt": (deep_gemm.bf16_gemm_nt, a, b),
        "nn": (deep_gemm.bf16_gemm_nn, a, b.t().contiguous()),
        "tn": (deep_gemm.bf16_gemm_tn, a.t().contiguous(), b.t().contiguous()),
        "tt": (deep_gemm.bf16_gemm_tt, a.t().contiguous(), b),
    }


@pytest.mark.parametrize("m,n,k,out_dtype,accumulate", list(_forward_cases()))
def test_deepgemm_grid(m, n, k, out_dtype, accumulate):
    g = torch.Generator().manual_seed(m * 7 + n * 3 + k)
    a = make_operand((m, k), torch.bfloat16, "cpu", generator=g)
    b = make_operand((n, k), torch.bfloat16, "cpu", generator=g)
    c = make_operand((m, n), out_dtype, "cpu", generator=g, scale=32) if accumulate else None
    ref = a.double() @ b.double().T + (0 if c is None else c.double())
    threshold = EXACT_THRESHOLD if out_dtype == torch.float32 else BF16_THRESHOLD
    for name, (fn, x, y) in _layouts(a, b).items():
        d = torch.empty(m, n, dtype=out_dtype)
        if c is not None:
            d.copy_(c)
        assert fn(x, y, d, c=d if c is not None else None) is None
        diff = calc_diff(d, ref)
        assert diff < threshold, f"{name}: calc_diff {diff:.3g}"


@pytest.mark.parametrize("m,n,k", [(4096 // 8, 576, 896), (512, 1024, 256)])
def test_backward_shapes(m, n, k):
    """enumerate_normal's backward GEMMs: dgrad with MN-major B; wgrad with MN-major A and B (FP32 accumulate)."""
    g = torch.Generator().manual_seed(11)
    grad = make_operand((m, n), torch.bfloat16, "cpu", generator=g)
    w = make_operand((n, k), torch.bfloat16, "cpu", generator=g)
    x = make_operand((m, k), torch.bfloat16, "cpu", generator=g)
    dgrad = torch.empty(m, k, dtype=torch.bfloat16)
    deep_gemm.bf16_gemm_nn(grad, w, dgrad)
    assert calc_diff(dgrad, grad.double() @ w.double()) < BF16_THRESHOLD
    acc = make_operand((n, k), torch.float32, "cpu", generator=g, scale=32)
    wgrad = acc.clone()
    deep_gemm.bf16_gemm_tn(grad, x, wgrad, c=wgrad)
    assert calc_diff(wgrad, acc.double() + grad.double().T @ x.double()) < EXACT_THRESHOLD


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(0, 70),
    n=st.integers(0, 70),
    k=st.integers(0, 300),
    a_mn_major=st.booleans(),
    b_mn_major=st.booleans(),
    dtype=st.sampled_from([torch.bfloat16, torch.float16, torch.float32]),
    out_fp32=st.booleans(),
    with_c=st.booleans(),
    alpha=st.sampled_from([1.0, -0.5, 3.0]),
)
def test_random_shapes_and_layouts(m, n, k, a_mn_major, b_mn_major, dtype, out_fp32, with_c, alpha):
    g = torch.Generator().manual_seed(m * 1000 + n * 10 + k)
    a = make_operand((m, k), dtype, "cpu", mn_major=a_mn_major, generator=g)
    b = make_operand((n, k), dtype, "cpu", mn_major=b_mn_major, generator=g)
    out_dtype = torch.float32 if out_fp32 else dtype
    c = make_operand((m, n), out_dtype, "cpu", generator=g) if with_c else None
    out = bf16_gemm(a, b, c, alpha=alpha, out_dtype=out_dtype)
    ref = alpha * (a.double() @ b.double().T) + (0 if c is None else c.double())
    assert out.shape == (m, n) and out.dtype == out_dtype and out.is_contiguous()
    if out_dtype == torch.float32:
        assert calc_diff(out, ref) < EXACT_THRESHOLD
    else:
        # One rounding of the FP32 accumulator: every element within half an ulp (plus FP32 slack).
        ulp = torch.finfo(out_dtype).eps * ref.abs()
        assert ((out.double() - ref).abs() <= 0.5 * ulp + 1e-4 * (1 + ref.abs())).all()


def test_single_rounding_with_accumulator():
    """d = cast(c + A.B) is rounded once: equal to rounding the fp64 sum for well-separated values."""
    g = torch.Generator().manual_seed(5)
    a = make_operand((64, 512), torch.bfloat16, "cpu", generator=g)
    b = make_operand((96, 512), torch.bfloat16, "cpu", generator=g)
    c = make_operand((64, 96), torch.bfloat16, "cpu", generator=g, scale=32)
    for m in (1, 64):  # the native small-M path and the panel path
        out = bf16_gemm(a[:m], b, c[:m])
        ref = (a[:m].double() @ b.double().T + c[:m].double()).to(torch.bfloat16)
        mismatch = (out != ref).float().mean().item()
        assert mismatch < 0.01, f"M={m}: {mismatch:.2%} of elements differ from the once-rounded reference"


@pytest.mark.parametrize("m", [1, 2, 7, 8, 9])
@pytest.mark.parametrize("b_mn_major", [False, True])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_few_row_kernel_boundaries(m, b_mn_major, out_dtype):
    """The streaming few-row kernel (M <= 8) and the panel kernel (M > 8): N not a multiple of the 4-row
    group, K not a multiple of the 512-element chunk, column blocks wider than one chunk, alpha and c."""
    g = torch.Generator().manual_seed(m)
    n, k = 1031, 1100
    a = make_operand((m, k), torch.bfloat16, "cpu", mn_major=True, generator=g)
    b = make_operand((n, k), torch.bfloat16, "cpu", mn_major=b_mn_major, generator=g)
    c = make_operand((m, n), out_dtype, "cpu", generator=g, scale=4)
    out = bf16_gemm(a, b, c, alpha=-0.75, out_dtype=out_dtype)
    ref = -0.75 * (a.double() @ b.double().T) + c.double()
    threshold = EXACT_THRESHOLD if out_dtype == torch.float32 else BF16_THRESHOLD
    assert calc_diff(out, ref) < threshold
