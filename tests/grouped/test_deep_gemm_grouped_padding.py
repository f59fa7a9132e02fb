"""m-grouped contiguous GEMMs with an id layout (``m_indices``, ``-1`` padding rows) as upstream: every row
of ``d`` is written, ``-1`` rows as zeros, whatever ``ensure_zero_padding`` says, and ``M`` need not be a
multiple of the alignment (issue 14, points 7 and 11)."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from tests.grouped.specs import ids_layout
from torch_ascend_moe import quant
from torch_ascend_moe.testing import calc_diff

ALIGN = 32
COUNTS = [40, 0, 75, 9]


@pytest.fixture(autouse=True)
def alignment():
    old = deep_gemm.get_mk_alignment_for_contiguous_layout()
    deep_gemm.set_mk_alignment_for_contiguous_layout(ALIGN)
    yield
    deep_gemm.set_mk_alignment_for_contiguous_layout(old)


def _reference(x, w, layout):
    ref = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float64)
    for i, g in enumerate(layout.tolist()):
        if g >= 0:
            ref[i] = x[i].double() @ w[g].double().T
    return ref


def _operands(kind, x, w):
    """(a, b, kwargs) for m_grouped_{bf16,fp8_fp4}_gemm_nt_contiguous; FP8 acts x FP8 or FP4 weights."""
    if kind == "bf16":
        return x.bfloat16(), w.bfloat16(), {}
    fp4 = kind == "fp4"
    a = quant.per_token_cast_to_fp8(x, use_ue8m0=fp4, gran_k=32 if fp4 else 128)
    if fp4:
        parts = [quant.per_token_cast_to_fp4(w[g], True, gran_k=32) for g in range(w.shape[0])]
        kwargs = {"recipe_a": (1, 32), "recipe_b": (1, 32)}
    else:
        parts = [quant.per_block_cast_to_fp8(w[g], False) for g in range(w.shape[0])]
        kwargs = {}
    return a, (torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])), kwargs


def _run(kind, a, b, d, layout, **kwargs):
    fn = (
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous
        if kind == "bf16"
        else deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous
    )
    fn(a, b, d, layout, **kwargs)


@pytest.mark.parametrize("kind", ["bf16", "fp8", "fp4"])
@pytest.mark.parametrize("ensure_zero_padding", [True, False])
def test_id_layout_writes_padding_rows_as_zeros(kind, ensure_zero_padding):
    g = torch.Generator().manual_seed(0)
    layout = ids_layout(COUNTS, ALIGN)
    x, w = torch.randn(layout.numel(), 128, generator=g), torch.randn(len(COUNTS), 64, 128, generator=g)
    x[layout < 0] = 0  # upstream's test zeroes A's padding rows
    a, b, kwargs = _operands(kind, x, w)
    d = torch.full((x.shape[0], w.shape[1]), 7.0, dtype=torch.bfloat16)
    _run(kind, a, b, d, layout, ensure_zero_padding=ensure_zero_padding, **kwargs)
    assert (d[layout < 0] == 0).all()
    # Upstream compares the whole of d (padding rows included) with a reference that is 0 there.
    assert calc_diff(d, _reference(x, w, layout)) < {"bf16": 1e-5, "fp8": 1e-3, "fp4": 1e-2}[kind]


@pytest.mark.parametrize("kind", ["bf16", "fp8"])
def test_id_layout_any_m(kind):
    # transformers sizes `a` with an upper bound of padded rows (tokens + min(tokens, experts) * (align - 1)),
    # not a multiple of the alignment; upstream's kernels take it (only segment starts are aligned).
    g = torch.Generator().manual_seed(1)
    layout = torch.cat([ids_layout(COUNTS, ALIGN), torch.full((13,), -1, dtype=torch.int32)])
    assert layout.numel() % ALIGN
    x, w = torch.randn(layout.numel(), 128, generator=g), torch.randn(len(COUNTS), 64, 128, generator=g)
    a, b, kwargs = _operands(kind, x, w)
    d = torch.empty(x.shape[0], w.shape[1], dtype=torch.bfloat16)
    _run(kind, a, b, d, layout, **kwargs)
    owned = layout >= 0
    assert calc_diff(d[owned], _reference(x, w, layout)[owned]) < (1e-5 if kind == "bf16" else 1e-3)
    assert (d[~owned] == 0).all()
