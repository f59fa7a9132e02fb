"""Majorness of packed FP4 operands comes from the strides, as upstream (``get_major_type_ab``): an MN-major
operand ``transpose_packed_fp4(x).T`` (``[MN/2, K]``, ``stride(-2) == 1``) holds ``MN`` rows, in the dense,
m-grouped and masked ``_nt`` entry points alike (issue 14, point 8)."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from tests.grouped.specs import psum_layout
from torch_ascend_moe.testing import calc_diff

M, N, K = 32, 48, 128
RECIPE = {"recipe_a": (1, 32), "recipe_b": (1, 32)}


def _fp4(x, mn_major):
    """Upstream's generators.cast_fp8_fp4_with_major for FP4: K-major packed, or transposed packed, then .T."""
    data, sf = deep_gemm.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=32)
    return (deep_gemm.transpose_packed_fp4(data).T, sf) if mn_major else (data, sf)


def _fp8(x, mn_major):
    data, sf = deep_gemm.per_token_cast_to_fp8(x, use_ue8m0=True, gran_k=32)
    return (data.T.contiguous().T, sf) if mn_major else (data, sf)


@pytest.mark.parametrize("a_fp4", [False, True])
@pytest.mark.parametrize("mn_major", [(False, True), (True, False), (True, True)], ids=["b", "a", "ab"])
def test_dense_nt_mn_major_fp4(a_fp4, mn_major):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(M, K, generator=g), torch.randn(N, K, generator=g)
    a = (_fp4 if a_fp4 else _fp8)(x, mn_major[0])
    b = _fp4(w, mn_major[1])
    assert b[0].stride(-2) == 1 if mn_major[1] else b[0].stride(-1) == 1
    d = torch.empty(M, N, dtype=torch.bfloat16)
    deep_gemm.fp8_fp4_gemm_nt(a, b, d, **RECIPE)
    ref = torch.empty_like(d)
    deep_gemm.fp8_fp4_gemm_nt(
        (_fp4 if a_fp4 else _fp8)(x, False), _fp4(w, False), ref, **RECIPE
    )  # same codes, K-major: bitwise the same result
    assert torch.equal(d, ref)
    assert calc_diff(d, x @ w.T) < (0.02 if a_fp4 else 0.01)


def _grouped_fp4_mn_major(w):
    """Upstream's grouped_cast_fp8_fp4_with_major: [G, K, N/2] transposed packs, returned as .mT."""
    parts = [deep_gemm.per_token_cast_to_fp4(w[i], use_ue8m0=True, gran_k=32) for i in range(w.shape[0])]
    data = torch.stack([deep_gemm.transpose_packed_fp4(p[0]) for p in parts])
    return data.mT, torch.stack([p[1] for p in parts])


def test_m_grouped_contiguous_mn_major_fp4_weights():
    g = torch.Generator().manual_seed(1)
    counts, align = [20, 0, 12], 32
    old = deep_gemm.get_mk_alignment_for_contiguous_layout()
    deep_gemm.set_mk_alignment_for_contiguous_layout(align)
    try:
        layout, rows = psum_layout(counts, align)
        x, w = torch.randn(rows, K, generator=g), torch.randn(len(counts), N, K, generator=g)
        a = _fp8(x, False)
        b = _grouped_fp4_mn_major(w)
        assert b[0].shape == (len(counts), N // 2, K) and b[0].stride(-2) == 1
        d = torch.zeros(rows, N, dtype=torch.bfloat16)
        deep_gemm.m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=True, **RECIPE)
        start = 0
        for grp, count in enumerate(counts):
            start = -(-start // align) * align
            if count:
                assert calc_diff(d[start : start + count], x[start : start + count] @ w[grp].T) < 0.01
            start += count
    finally:
        deep_gemm.set_mk_alignment_for_contiguous_layout(old)


def test_masked_mn_major_fp4_weights():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 16, K, generator=g), torch.randn(2, N, K, generator=g)
    parts = [deep_gemm.per_token_cast_to_fp8(x[i], use_ue8m0=True, gran_k=32) for i in range(2)]
    a = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    masked = torch.tensor([16, 7], dtype=torch.int32)
    d = torch.zeros(2, 16, N, dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_fp4_gemm_nt_masked(a, _grouped_fp4_mn_major(w), d, masked, 16, **RECIPE)
    for i, m in enumerate(masked.tolist()):
        assert calc_diff(d[i, :m], x[i, :m] @ w[i].T) < 0.01
