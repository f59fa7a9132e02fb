"""deep_gemm.legacy: upstream's Triton grouped GEMM signatures, checked against plain loops."""

import torch

from torch_ascend_moe.deep_gemm import legacy
from torch_ascend_moe.testing import calc_diff


def _ids(counts, alignment):
    ids = []
    for g, c in enumerate(counts):
        ids += [g] * c + [-1] * ((-c) % alignment)
    return torch.tensor(ids, dtype=torch.int32)


def test_m_grouped_and_a_fused_forms():
    g = torch.Generator().manual_seed(0)
    m_indices = _ids([5, 0, 11, 3], 8)
    a, b = torch.randn(m_indices.numel(), 32, generator=g).bfloat16(), torch.randn(4, 24, 32, generator=g).bfloat16()
    ref = torch.zeros(m_indices.numel(), 24, dtype=torch.float64)
    for i, grp in enumerate(m_indices.tolist()):
        if grp >= 0:
            ref[i] = b[grp].double() @ a[i].double()
    d = torch.empty(m_indices.numel(), 24, dtype=torch.bfloat16)
    legacy.m_grouped_bf16_gemm_nt_contiguous_tl(a, b, d, m_indices)
    assert calc_diff(d, ref) < 1e-5
    d_nn = torch.empty_like(d)
    legacy.m_grouped_bf16_gemm_nn_contiguous_tl(a, b.transpose(1, 2).contiguous(), d_nn, m_indices)
    assert torch.equal(d_nn, d)
    # a_fused: the virtual A gathers rows of a smaller token buffer (-1 -> zero row).
    tokens = torch.randn(9, 32, generator=g).bfloat16()
    rows = torch.randint(0, 9, (m_indices.numel(),), generator=g).to(torch.int32)
    rows[m_indices < 0] = -1
    d_fused = torch.empty_like(d)
    legacy.a_fused_m_grouped_bf16_gemm_nt_contiguous_tl(tokens, b, d_fused, (m_indices, rows))
    expected = torch.empty_like(d)
    legacy.m_grouped_bf16_gemm_nt_contiguous_tl(
        torch.where((rows >= 0)[:, None], tokens[rows.clamp(min=0)], 0), b, expected, m_indices
    )
    assert torch.equal(d_fused, expected)


def test_k_grouped_fused_forms():
    g = torch.Generator().manual_seed(1)
    k_start, k_end = torch.tensor([0, 128, 128], dtype=torch.int32), torch.tensor([128, 128, 384], dtype=torch.int32)
    k_indices = torch.randperm(384, generator=g).to(torch.int32)
    a, b = torch.randn(384, 16, generator=g).bfloat16(), torch.randn(384, 8, generator=g).bfloat16()
    d0 = torch.randn(3, 16, 8, generator=g)
    for fused, acc in (
        (legacy.a_fused_k_grouped_bf16_gemm_tn_contiguous_tl, True),
        (legacy.b_fused_k_grouped_bf16_gemm_tn_contiguous_tl, False),
    ):
        d = d0.clone()
        fused(a, b, d, (k_indices, k_start, k_end), acc)
        for grp, (s, e) in enumerate(zip(k_start.tolist(), k_end.tolist())):
            idx = k_indices[s:e].long()
            if fused is legacy.a_fused_k_grouped_bf16_gemm_tn_contiguous_tl:
                ref = a[idx].double().T @ b[s:e].double()
            else:
                ref = a[s:e].double().T @ b[idx].double()
            ref = ref + (d0[grp].double() if acc else 0)
            assert (
                calc_diff(d[grp], ref) < 1e-5 if e > s else torch.equal(d[grp], d0[grp] if acc else torch.zeros(16, 8))
            )
