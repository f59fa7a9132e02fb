"""DeepGEMM 2.8's ``k_grouped_fp4_gemm_nt_contiguous`` (specs/upstream_2609.md §4) on our compat package: FP4 x FP4
weight gradients per K group, exact against fp64 on the quantized values (E2M1 re-encoded as E4M3 is lossless), with
``c`` accumulation, empty groups, FP32 and packed int32 UE8M0 scales, and upstream's refusals."""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from torch_ascend_moe import quant
from torch_ascend_moe.testing import calc_diff


def _operands(mn_a, mn_b, ks, seed, packed):
    g = torch.Generator().manual_seed(seed)
    total = sum(ks)
    out = []
    for mn in (mn_a, mn_b):
        x = torch.randn(mn, total, generator=g)
        data, sf = quant.per_token_cast_to_fp4(x, True, gran_k=32)
        values = quant.cast_back_from_fp4(data, sf, gran_k=32).double()
        if packed:
            sf = quant.per_token_cast_to_fp4(x, True, gran_k=32, use_packed_ue8m0=True)[1]
        out.append(((data, sf.T.contiguous()), values))  # scales K first, as upstream's generators lay them out
    return out


def _reference(av, bv, ks):
    blocks, o = [], 0
    for k in ks:
        blocks.append(av[:, o : o + k] @ bv[:, o : o + k].T)
        o += k
    return torch.stack(blocks)


@pytest.mark.parametrize("packed", [False, True], ids=["fp32-sf", "int32-sf"])
def test_exact_on_the_quantized_values(packed):
    ks = [256, 512, 0, 256]
    (a, av), (b, bv) = _operands(48, 80, ks, 1, packed)
    d = torch.empty(len(ks), 48, 80)
    layout = torch.tensor(ks, dtype=torch.int32)
    deep_gemm.k_grouped_fp4_gemm_nt_contiguous(a, b, d, ks, layout)
    ref = _reference(av, bv, ks)
    assert calc_diff(d, ref) < 1e-10 and bool((d[2] == 0).all())
    c = torch.randn(d.shape)
    deep_gemm.k_grouped_fp4_gemm_nt_contiguous(a, b, d, ks, layout, c=c)
    assert calc_diff(d, ref + c.double()) < 1e-10
    psum = torch.tensor(ks, dtype=torch.int32).cumsum(0).to(torch.int32)  # 2.8's psum layout, no ks_cpu
    deep_gemm.k_grouped_fp4_gemm_nt_contiguous(a, b, d, None, psum, use_psum_layout=True)
    assert calc_diff(d, ref) < 1e-10


def test_refusals():
    ks = [256, 128]
    (a, _), (b, _) = _operands(16, 16, ks, 2, False)
    d = torch.empty(2, 16, 16)
    layout = torch.tensor(ks, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"argument 'ks_cpu' values: expected multiples of 256"):
        deep_gemm.k_grouped_fp4_gemm_nt_contiguous(a, b, d, ks, layout)
    with pytest.raises(ValueError, match=r"argument 'recipe' value: expected \(1, 1, 32\)"):
        deep_gemm.k_grouped_fp4_gemm_nt_contiguous(a, b, d, [256, 128], layout, recipe=(1, 1, 128))


def test_fp8_k_grouped_takes_2_8s_padded_scale_rows_and_no_c():
    """DeepGEMM 2.8 lays k-grouped FP32 scales one row per ``gran_k`` physical rows of A (groups at aligned starts);
    2.6.1 compactly. Both give the same product; without ``c`` it is written (2.8, SM100)."""
    g = torch.Generator().manual_seed(5)
    m, n, gran = 24, 40, 32
    ends = [100, 328]  # psum: group 1 starts at the alignment (128)
    a = torch.randn(384, m, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(384, n, generator=g).to(torch.float8_e4m3fn)
    compact_rows = [*range(0, 4), *range(4, 11)]  # ceil(100/32) rows, then ceil(228/32) from row 128/32
    sfa = 2.0 ** torch.randint(-3, 3, (12, m), generator=g).float()
    sfb = 2.0 ** torch.randint(-3, 3, (12, n), generator=g).float()
    layout = torch.tensor(ends, dtype=torch.int32)
    d_padded, d_compact = torch.empty(2, m, n), torch.empty(2, m, n)
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous(
        (a, sfa), (b, sfb), d_padded, None, layout, None, (1, 1, gran), use_psum_layout=True
    )
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous(
        (a, sfa[compact_rows]),
        (b, sfb[compact_rows]),
        d_compact,
        None,
        layout,
        None,
        (1, 1, gran),
        use_psum_layout=True,
    )
    assert torch.equal(d_padded, d_compact)
    av = a.double() * sfa.double().repeat_interleave(gran, 0)
    bv = b.double() * sfb.double().repeat_interleave(gran, 0)
    ref = torch.stack([av[:100].T @ bv[:100], av[128:328].T @ bv[128:328]])
    assert calc_diff(d_padded, ref) < 1e-10
