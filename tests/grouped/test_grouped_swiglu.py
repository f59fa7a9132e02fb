"""``m_grouped_bf16_gemm_swiglu`` and ``m_grouped_fp8_gemm_swiglu`` beyond the contract harness: the fused C++ kernels
against the unfused composition they replace (``m_grouped_bf16_gemm`` / ``m_grouped_fp8_gemm`` then the epilogue, the
portable kernels) on random layouts, strides, thread counts,
few-row (streaming) and many-row segments, non-finite values; its backward against autograd through that
composition.

Bit for bit they agree on most shapes, not all: MKL's SGEMM may order the FP32 sums differently for the kernel's
column tiles than for the whole matrix, so the comparison allows the rounding that ordering moves."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fp8_gemm.specs import _FORMATS, quantize
from tests.grouped.specs import ids_layout, psum_layout
from torch_ascend_moe.backends.portable.grouped import m_grouped_bf16_gemm_swiglu as portable
from torch_ascend_moe.backends.portable.grouped import m_grouped_fp8_gemm_swiglu as portable_fp8
from torch_ascend_moe.backends.portable.grouped import swiglu_epilogue
from torch_ascend_moe.ops.grouped import (
    m_grouped_bf16_gemm,
    m_grouped_bf16_gemm_swiglu,
    m_grouped_fp8_gemm,
    m_grouped_fp8_gemm_swiglu,
)


def _same(got, want) -> bool:
    """Bit for bit, NaN where NaN (FP8 compared through FP32)."""
    got, want = got.float(), want.float()
    return torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(), want.nan_to_num())


def _dequantized(out, sf, gran):
    return out.float() if not gran else out.float() * sf.repeat_interleave(gran, dim=1)[:, : out.shape[1]]


def _assert_close(out, sf, want_out, want_sf, gran, h_dtype=None) -> None:
    """Equal to the composition up to the order of the FP32 sums (MKL's SGEMM blocks differently for other shapes:
    the L1 output may round to the neighbouring value): non-finite values in the same places, finite ones within
    two roundings of the output format, or of a BF16 L1 output (``h_dtype``) where that is coarser (one FP8 step of
    the row's scale when quantized)."""
    got, want = _dequantized(out, sf, gran), _dequantized(want_out, want_sf, gran)
    assert torch.equal(got.isnan(), want.isnan()) and torch.equal(got.isinf(), want.isinf())
    assert torch.equal(got[got.isinf()], want[want.isinf()])
    finite = got.isfinite()
    if gran:
        scale = want.abs().nan_to_num(0, 0, 0).amax(dim=1, keepdim=True).expand_as(want)
        tol = scale / 14 + 1e-6  # an E4M3 step is at most 32 / 448 of the row's amax
    else:
        ulp = 2**-7 if torch.bfloat16 in (out.dtype, h_dtype) else 2**-20
        tol = 4 * ulp * (1 + want.abs())
    assert ((got - want).abs()[finite] <= tol[finite]).all()


@st.composite
def _calls(draw):
    groups = draw(st.integers(1, 5))
    # Few-row segments take the streaming path, many-row ones the FP32-tile GEMM path.
    counts = draw(st.lists(st.sampled_from([0, 1, 3, 8, 9, 40, 300]), min_size=groups, max_size=groups))
    alignment = draw(st.sampled_from([1, 4, 16]))
    psum = draw(st.booleans())
    gran = draw(st.sampled_from([0, 0, 16, 32, 128]))
    inter = draw(st.sampled_from([8, 24, 64, 80])) if not gran else draw(st.sampled_from([gran, 2 * gran, 3 * gran]))
    k = draw(st.sampled_from([16, 40, 128]))
    dtype = draw(st.sampled_from([torch.bfloat16, torch.float32]))
    return {
        "counts": counts,
        "alignment": alignment,
        "psum": psum,
        "gran": gran,
        "inter": inter,
        "k": k,
        "dtype": dtype,
        "weighted": draw(st.booleans()),
        "clamp": draw(st.sampled_from([None, 0.5, 3.0])),
        "ue8m0": bool(gran) and draw(st.booleans()),
        "b_mn_major": draw(st.booleans()),
        "a_strided": draw(st.booleans()),
        "nonfinite": draw(st.booleans()),
        "threads": draw(st.sampled_from([1, 2])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _inputs(c):
    g = torch.Generator().manual_seed(c["seed"])
    layout, rows = psum_layout(c["counts"], c["alignment"]) if c["psum"] else (ids_layout(c["counts"], 1), None)
    rows = rows if c["psum"] else layout.numel()
    alignment = c["alignment"] if c["psum"] else 1
    a = torch.randn(rows, c["k"] * (2 if c["a_strided"] else 1), generator=g)
    a = a[:, ::2] if c["a_strided"] else a
    if c["nonfinite"] and rows:
        a[torch.randint(rows, (2,), generator=g), torch.randint(c["k"], (2,), generator=g)] = torch.tensor(
            [float("nan"), float("inf")]
        )
    b = torch.randn(len(c["counts"]), 2 * c["inter"], c["k"], generator=g) / c["k"] ** 0.5
    if c["b_mn_major"]:
        b = b.transpose(1, 2).contiguous().transpose(1, 2)
    w = torch.rand(rows, generator=g) if c["weighted"] else None
    return a.to(c["dtype"]), b.to(c["dtype"]), layout, alignment, w


@settings(max_examples=60, deadline=None)
@given(_calls())
def test_fused_kernel_is_the_composition(c):
    a, b, layout, alignment, w = _inputs(c)
    kw = {
        "psum": c["psum"],
        "alignment": alignment,
        "row_weights": w,
        "activation_clamp": c["clamp"],
        "quant_gran_k": c["gran"],
        "use_ue8m0": c["ue8m0"],
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(c["threads"])
    try:
        out, sf = m_grouped_bf16_gemm_swiglu(a, b, layout, **kw)
    finally:
        torch.set_num_threads(threads)
    want_out, want_sf = portable(a, b, layout, **kw)
    assert out.dtype == want_out.dtype and out.shape == want_out.shape and sf.shape == want_sf.shape
    _assert_close(out, sf, want_out, want_sf, c["gran"])


def test_streaming_segments_and_padding_rows():
    """Decode-sized segments (2 rows per expert), an aligned layout's padding rows (h = 0: silu(0) * 0 = 0, scale from
    the amax floor)."""
    g = torch.Generator().manual_seed(1)
    layout, rows = psum_layout([2, 0, 1, 2], 8)
    a = torch.randn(rows, 64, generator=g).bfloat16()
    b = torch.randn(4, 256, 64, generator=g).bfloat16()
    out, sf = m_grouped_bf16_gemm_swiglu(a, b, layout, alignment=8, quant_gran_k=32, use_ue8m0=True)
    want_out, want_sf = portable(a, b, layout, alignment=8, quant_gran_k=32, use_ue8m0=True)
    _assert_close(out, sf, want_out, want_sf, 32)
    pad = torch.ones(rows, dtype=torch.bool)
    pad[[0, 1, 8, 16, 17]] = False
    assert out[pad].float().eq(0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_backward_is_autograd_of_the_composition(dtype):
    g = torch.Generator().manual_seed(2)
    layout, rows = psum_layout([5, 0, 11], 4)
    a = torch.randn(rows, 32, generator=g).to(dtype).requires_grad_()
    b = (torch.randn(3, 48, 32, generator=g) / 6).to(dtype).requires_grad_()
    w = torch.rand(rows, generator=g).requires_grad_()
    grad = torch.randn(rows, 24, generator=g).to(dtype)
    out, _ = m_grouped_bf16_gemm_swiglu(a, b, layout, alignment=4, row_weights=w, activation_clamp=1.0)
    got = torch.autograd.grad(out, (a, b, w), grad)
    h = m_grouped_bf16_gemm(a, b, layout, alignment=4)
    ref, _ = swiglu_epilogue(h, w, 1.0, 0, False, dtype)
    want = torch.autograd.grad(ref, (a, b, w), grad)
    assert torch.allclose(out.float(), ref.float(), rtol=2**-6, atol=1e-6)
    # The backward recomputes the L1 output with m_grouped_bf16_gemm and differentiates the same epilogue: the
    # composition's own gradients, bit for bit.
    for x, y in zip(got, want, strict=True):
        assert _same(x, y)


def test_fp8_output_has_no_gradient():
    a, b = torch.randn(4, 16, requires_grad=True), torch.randn(1, 64, 16)
    out, _ = m_grouped_bf16_gemm_swiglu(a, b, torch.tensor([4], dtype=torch.int32), quant_gran_k=32)
    with pytest.raises(RuntimeError, match=r"argument 'quant_gran_k' is 32, but the FP8 output has no gradient"):
        out.float().sum().backward()


# ---- m_grouped_fp8_gemm_swiglu: the fused kernel against m_grouped_fp8_gemm then the same epilogue ----


@st.composite
def _fp8_calls(draw):
    groups = draw(st.integers(1, 4))
    fmt = draw(st.sampled_from(range(len(_FORMATS))))
    gran = draw(st.sampled_from([0, 0, 16, 32, 128]))
    # B's 128-row scale blocks (format 0) may straddle the gate/up boundary (I = 64, 80) or not (I = 128).
    inter = draw(st.sampled_from([32, 64, 80, 128])) if not gran else draw(st.sampled_from([gran, 2 * gran]))
    return {
        "counts": draw(st.lists(st.sampled_from([0, 1, 3, 8, 9, 40, 300]), min_size=groups, max_size=groups)),
        "alignment": draw(st.sampled_from([1, 8])),
        "psum": draw(st.booleans()),
        "fmt": fmt,
        "inter": inter,
        "k": draw(st.sampled_from([128, 256])),
        "gran": gran,
        "ue8m0": bool(gran) and draw(st.booleans()),
        "weighted": draw(st.booleans()),
        "clamp": draw(st.sampled_from([None, 0.5, 3.0])),
        "out_dtype": None if gran else draw(st.sampled_from([None, torch.float32])),
        "bad_scale": draw(st.sampled_from([None, "nan", "inf"])),
        "threads": draw(st.sampled_from([1, 2])),
        "seed": draw(st.integers(0, 2**16)),
    }


def _fp8_inputs(c):
    g = torch.Generator().manual_seed(c["seed"])
    layout, rows = psum_layout(c["counts"], c["alignment"]) if c["psum"] else (ids_layout(c["counts"], 1), None)
    rows = rows if c["psum"] else layout.numel()
    alignment = c["alignment"] if c["psum"] else 1
    _, fa, fb = _FORMATS[c["fmt"]]
    a, sfa, recipe_a = quantize(torch.randn(rows, c["k"], generator=g), fa)
    experts = [quantize(torch.randn(2 * c["inter"], c["k"], generator=g) / 4, fb) for _ in c["counts"]]
    b, sfb = torch.stack([e[0] for e in experts]), torch.stack([e[1] for e in experts])
    if c["bad_scale"] and sfb.numel():  # a non-finite weight scale: the dequantized path puts NaN/inf in place
        sfb.view(-1)[torch.randint(sfb.numel(), (1,), generator=g)] = float(c["bad_scale"])
    w = torch.rand(rows, generator=g) if c["weighted"] else None
    kw = {
        "psum": c["psum"],
        "alignment": alignment,
        "recipe_a": recipe_a,
        "recipe_b": experts[0][2],
        "row_weights": w,
        "activation_clamp": c["clamp"],
        "quant_gran_k": c["gran"],
        "use_ue8m0": c["ue8m0"],
        "out_dtype": c["out_dtype"],
    }
    return (a, sfa, b, sfb, layout), kw


@settings(max_examples=40, deadline=None)
@given(_fp8_calls())
def test_fp8_fused_kernel_is_the_composition(c):
    args, kw = _fp8_inputs(c)
    threads = torch.get_num_threads()
    torch.set_num_threads(c["threads"])
    try:
        out, sf = m_grouped_fp8_gemm_swiglu(*args, **kw)
    finally:
        torch.set_num_threads(threads)
    want_out, want_sf = portable_fp8(*args, **kw)
    assert out.dtype == want_out.dtype and out.shape == want_out.shape and sf.shape == want_sf.shape
    _assert_close(out, sf, want_out, want_sf, c["gran"], torch.bfloat16)


def test_fp8_backward_is_autograd_of_the_composition():
    """``row_weights`` gets the gradient of the composition (L1 by ``m_grouped_fp8_gemm``, the same epilogue) bit for
    bit; the quantized operands none."""
    g = torch.Generator().manual_seed(3)
    layout, rows = psum_layout([5, 0, 11], 4)
    _, fa, fb = _FORMATS[0]
    a, sfa, recipe_a = quantize(torch.randn(rows, 128, generator=g), fa)
    experts = [quantize(torch.randn(128, 128, generator=g) / 4, fb) for _ in range(3)]
    b, sfb, recipe_b = torch.stack([e[0] for e in experts]), torch.stack([e[1] for e in experts]), experts[0][2]
    w = torch.rand(rows, generator=g).requires_grad_()
    grad = torch.randn(rows, 64, generator=g).bfloat16()
    kw = {"alignment": 4, "recipe_a": recipe_a, "recipe_b": recipe_b}
    out, _ = m_grouped_fp8_gemm_swiglu(a, sfa, b, sfb, layout, row_weights=w, activation_clamp=1.0, **kw)
    (got,) = torch.autograd.grad(out, w, grad)
    h = m_grouped_fp8_gemm(a, sfa, b, sfb, layout, **kw)
    ref, _ = swiglu_epilogue(h, w, 1.0, 0, False, torch.bfloat16)
    (want,) = torch.autograd.grad(ref, w, grad)
    assert _same(got, want)
    scales = sfa.clone().requires_grad_()
    out, _ = m_grouped_fp8_gemm_swiglu(a, scales, b, sfb, layout, **kw)
    with pytest.raises(RuntimeError, match=r"argument 'sfa' requires grad, but scale factors are not differentiable"):
        out.float().sum().backward()
