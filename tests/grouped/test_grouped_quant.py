"""``m_grouped_fp8_quant_gemm``: the per-token cast inside the grouped FP8 GEMM is, bit for bit, ``quantize_fp8(x, [1,
gran_k])`` followed by ``m_grouped_fp8_gemm`` (random layouts, strides, dtypes, NaN/inf rows), rows no expert owns
are never read, and ``x``'s straight-through gradient is the exact ``grad @ deq(b[g])`` per row."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fp8_gemm.specs import quantize
from tests.grouped.specs import SPECS, _quantize_experts, _rows_of, ids_layout, psum_layout
from torch_ascend_moe._registry import full_call
from torch_ascend_moe.backends import chain
from torch_ascend_moe.backends.portable import grouped as portable
from torch_ascend_moe.checks.grouped import M_GROUPED, layout_segments
from torch_ascend_moe.quant import reference

ops = torch.ops.ascend_moe
SPEC = next(s for s in SPECS if s.name == "m_grouped_fp8_quant_gemm")


def _composition(x, b, sfb, layout, psum, alignment, gran_k, recipe_b, ue8m0, out_dtype):
    """The two ops the fused one stands for (the C++ kernels of each)."""
    q, sf = ops.quantize_fp8(x, [1, gran_k], ue8m0, False)
    dtype = out_dtype if out_dtype is not None else x.dtype
    return ops.m_grouped_fp8_gemm(q, sf, b, sfb, layout, psum, alignment, [1, gran_k], recipe_b, dtype)


def _same(out: torch.Tensor, want: torch.Tensor) -> bool:
    return (
        out.dtype == want.dtype
        and torch.equal(out.isnan(), want.isnan())
        and torch.equal(out.nan_to_num(), want.nan_to_num())
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_the_samples_equal_the_composition_bit_for_bit(dtype):
    for s in SPEC.sample_inputs("cpu", dtype):
        args = full_call(SPEC.name, *s.args)
        x = args[0].detach().clone()
        if x.shape[0] >= 3:  # NaN/inf in owned rows: their own rows only
            x[0, 1], x[-1, -1] = float("nan"), float("inf")
        args = (x, *args[1:])
        want = _composition(*args)
        assert _same(ops.m_grouped_fp8_quant_gemm(*args), want), s.name
        # The portable kernel: its steps through the dispatcher (here the C++ cast and grouped GEMM).
        assert _same(portable.m_grouped_fp8_quant_gemm(*args), want), s.name
        # Every step portable: the reference cast (the same bits) and the portable per-segment GEMMs.
        q, sf = reference.quantize_fp8(x, (1, args[6]), args[8], False)
        portable_want = portable.m_grouped_fp8_gemm(q, sf, *args[1:6], [1, args[6]], args[7], want.dtype)
        with chain.on_cpu("cuda"), chain.disabled("triton"):
            assert _same(ops.m_grouped_fp8_quant_gemm(*args), portable_want), s.name


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    alignment=st.sampled_from([1, 4]),
    psum=st.booleans(),
    gran_k=st.sampled_from([32, 64, 128]),
    blocks=st.integers(1, 3),
    fmt=st.sampled_from(["fp8-token", "fp8-block", "fp4"]),
    ue8m0=st.booleans(),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    stride=st.sampled_from(["contiguous", "column-major", "sliced"]),
    out_dtype=st.sampled_from([None, torch.bfloat16, torch.float32]),
    seed=st.integers(0, 2**16),
)
def test_random_calls_equal_the_composition(
    counts, alignment, psum, gran_k, blocks, fmt, ue8m0, dtype, stride, out_dtype, seed
):
    g = torch.Generator().manual_seed(seed)
    k = 128 * blocks  # a multiple of every gran_k and of the 128 x 128 weight blocks
    layout, rows = psum_layout(counts, alignment) if psum else (ids_layout(counts, alignment), None)
    rows = rows if psum else layout.numel()
    scale = torch.logspace(-4, 4, rows).unsqueeze(1)  # rows spanning many binades
    x = (torch.randn(rows, k, generator=g) * scale).to(dtype)
    owned = _rows_of(layout, psum, alignment, rows, len(counts))
    x[~owned] = float("nan")  # never read: a kernel that did would put NaN in the output
    if stride == "column-major":
        x = x.t().contiguous().t()
    elif stride == "sliced":
        x = torch.cat([x, x], 1)[:, :k]  # row stride 2K
    weight_fmt = {"fp8-token": ("fp8-token", 1, gran_k, ue8m0), "fp8-block": ("fp8-block", 128, 128, ue8m0)}
    weight_fmt["fp4"] = ("fp4", 1, 32, ue8m0)
    b, sfb, recipe_b = _quantize_experts(torch.randn(len(counts), 24, k, generator=g), weight_fmt[fmt])
    args = (x, b, sfb, layout, psum, alignment, gran_k, recipe_b, ue8m0, out_dtype)
    out = ops.m_grouped_fp8_quant_gemm(*args)
    assert _same(out, _composition(*args))
    assert not out.isnan().any() and not out[~owned].any()


def _experts(g, groups, n, k):
    return _quantize_experts(torch.randn(groups, n, k, generator=g), ("fp8-block", 128, 128, False))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("psum", [True, False], ids=["psum", "ids"])
def test_straight_through_gradient_is_exact(dtype, psum):
    """dx[i] = dD[i] @ deq(b[g(i)]) in FP32, rounded once to x's dtype; rows no expert owns get zeros."""
    g = torch.Generator().manual_seed(5)
    counts, alignment = [3, 0, 5], 4
    layout, rows = psum_layout(counts, alignment) if psum else (ids_layout(counts, alignment), None)
    rows = rows if psum else layout.numel()
    b, sfb, recipe_b = _experts(g, len(counts), 40, 256)
    x = torch.randn(rows, 256, generator=g).to(dtype).requires_grad_()
    out = ops.m_grouped_fp8_quant_gemm(x, b, sfb, layout, psum, alignment)
    grad = torch.randn(out.shape, generator=g).to(out.dtype)
    out.backward(grad)
    want, bound = torch.zeros(rows, 256, dtype=torch.float64), torch.zeros(rows, 256, dtype=torch.float64)
    for grp, begin, end in layout_segments(M_GROUPED, layout, psum, alignment, rows, len(counts)):
        deq = reference.dequantized(b[grp], sfb[grp], recipe_b).double()
        want[begin:end] = grad[begin:end].double() @ deq
        bound[begin:end] = grad[begin:end].double().abs() @ deq.abs()
    assert x.grad.dtype == dtype
    # One FP32 sum of N = 40 products (the worst case of its rounding), then one rounding to x's dtype.
    tol = 40 * torch.finfo(torch.float32).eps * bound + torch.finfo(dtype).eps * want.abs()
    assert ((x.grad.double() - want).abs() <= tol).all()
    assert not x.grad[~_rows_of(layout, psum, alignment, rows, len(counts))].any()


def test_quantized_experts_refuse_gradients():
    g = torch.Generator().manual_seed(6)
    b, sfb, _ = _experts(g, 2, 8, 128)
    x = torch.randn(4, 128, generator=g, requires_grad=True)
    sfb.requires_grad_()
    out = ops.m_grouped_fp8_quant_gemm(x, b, sfb, torch.tensor([1, 4], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"ascend_moe::m_grouped_fp8_quant_gemm: argument 'sfb' requires grad"):
        out.sum().backward()


def test_one_token_per_expert_matches_fp8_quant_gemm():
    """A group of rows is ``fp8_quant_gemm`` of those rows with that expert (the grouped op adds no rounding)."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(6, 256, generator=g, dtype=torch.bfloat16)
    parts = [quantize(torch.randn(16, 256, generator=g), ("fp8-block", 128, 128, False)) for _ in range(3)]
    b, sfb = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    layout = torch.tensor([1, 1, 6], dtype=torch.int32)
    out = ops.m_grouped_fp8_quant_gemm(x, b, sfb, layout)
    assert torch.equal(out[:1], ops.fp8_quant_gemm(x[:1], b[0], sfb[0]))
    assert torch.equal(out[1:], ops.fp8_quant_gemm(x[1:], b[2], sfb[2]))
