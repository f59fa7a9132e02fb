"""Grouped GEMMs on DeepGEMM's grouped shapes (scaled down), gradients vs fp64, and routing under compile."""

import pytest
import torch

from tests.grouped.specs import ids_layout, psum_layout
from tests.moe_routing.specs import random_topk
from torch_ascend_moe import k_grouped_bf16_gemm, m_grouped_bf16_gemm, moe_permute, moe_unpermute
from torch_ascend_moe.testing import calc_diff


def _counts(groups: int, expected_m: int, g: torch.Generator) -> list[int]:
    """DeepGEMM's generator: int(expected_m * U(0.7, 1.3)) rows per group; one group empty."""
    counts = [int(expected_m * (0.7 + 0.6 * float(torch.rand(1, generator=g)))) for _ in range(groups)]
    counts[1] = 0
    return counts


@pytest.mark.parametrize("psum", [True, False], ids=["psum", "ids"])
@pytest.mark.parametrize("b_mn_major", [False, True], ids=["bK", "bMN"])
@pytest.mark.parametrize("groups,expected_m", [(4, 64), (8, 16)])
@pytest.mark.parametrize("n,k", [(192, 256), (128, 96)])
def test_m_grouped_grid(psum, b_mn_major, groups, expected_m, n, k):
    g = torch.Generator().manual_seed(groups * expected_m + n + k)
    counts, alignment = _counts(groups, expected_m, g), 32
    layout, rows = psum_layout(counts, alignment) if psum else (ids_layout(counts, alignment), None)
    rows = rows if psum else layout.numel()
    a = torch.randn(rows, k, generator=g).bfloat16()
    b = torch.randn(groups, n, k, generator=g).bfloat16()
    if b_mn_major:
        b = b.transpose(1, 2).contiguous().transpose(1, 2)
    d = m_grouped_bf16_gemm(a, b, layout, psum=psum, alignment=alignment)
    start = 0
    for grp, count in enumerate(counts):
        start = -(-start // alignment) * alignment
        ref = a[start : start + count].double() @ b[grp].double().T
        if count:
            assert calc_diff(d[start : start + count], ref) < 1e-5, grp
        padding = slice(start + count, -(-(start + count) // alignment) * alignment)
        assert (d[padding] == 0).all()  # ensure_zero_padding semantics
        start += count


def test_gradients_match_a_per_expert_fp64_reference():
    g = torch.Generator().manual_seed(3)
    counts = [7, 0, 12, 5]
    layout, rows = psum_layout(counts, 8)
    a = torch.randn(rows, 64, generator=g).bfloat16().requires_grad_()
    b = torch.randn(4, 48, 64, generator=g).bfloat16().requires_grad_()
    grad = torch.randn(rows, 48, generator=g).bfloat16()
    m_grouped_bf16_gemm(a, b, layout, alignment=8).backward(grad)
    ga, gb = torch.zeros(rows, 64, dtype=torch.float64), torch.zeros(4, 48, 64, dtype=torch.float64)
    start = 0
    for grp, count in enumerate(counts):
        start = -(-start // 8) * 8
        rows_g = slice(start, start + count)
        ga[rows_g] = grad[rows_g].double() @ b[grp].double()
        gb[grp] = grad[rows_g].double().T @ a[rows_g].double()
        start += count
    assert calc_diff(a.grad, ga) < 1e-5 and calc_diff(b.grad, gb) < 1e-5
    assert (b.grad[1] == 0).all()  # an empty group gets no gradient


def test_k_grouped_is_the_weight_gradient_of_m_grouped():
    g = torch.Generator().manual_seed(4)
    layout, rows = psum_layout([5, 9, 0, 3], 1)
    x, dy = torch.randn(rows, 32, generator=g), torch.randn(rows, 16, generator=g)
    dw = k_grouped_bf16_gemm(dy, x, layout, 4)
    ends = layout.tolist()
    starts = [0] + ends[:-1]
    for grp, (s, e) in enumerate(zip(starts, ends)):
        torch.testing.assert_close(dw[grp], dy[s:e].T @ x[s:e])


def _moe(x, topk_idx, topk_weights, w):
    """Route, one grouped GEMM, combine: the data path of an MoE layer (no activation)."""
    permuted, row_map, offs = moe_permute(x, topk_idx, w.shape[0], alignment=4)
    y = m_grouped_bf16_gemm(permuted, w, offs, alignment=4)
    return moe_unpermute(y, row_map, topk_weights)


def test_moe_data_path_matches_per_token_loop():
    g = torch.Generator().manual_seed(5)
    x, w = torch.randn(10, 32, generator=g), torch.randn(6, 24, 32, generator=g)
    idx, weights = random_topk(10, 2, 6, g), torch.rand(10, 2, generator=g)
    out = _moe(x, idx, weights, w)
    ref = torch.zeros(10, 24, dtype=torch.float64)
    for t in range(10):
        for j in range(2):
            if idx[t, j] >= 0:
                ref[t] += weights[t, j].double() * (w[idx[t, j]].double() @ x[t].double())
    assert calc_diff(out, ref) < 1e-10


def test_compiles_once_across_routings():
    """Routing is data: new routings with the same shapes reuse the one compiled graph (fwd + bwd)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(_moe, fullgraph=True, backend=counter)
    g = torch.Generator().manual_seed(6)
    w = torch.randn(8, 24, 32, generator=g, requires_grad=True)
    for _ in range(4):
        x = torch.randn(12, 32, generator=g, requires_grad=True)
        idx, weights = random_topk(12, 2, 8, g), torch.rand(12, 2, generator=g)
        out = compiled(x, idx, weights, w)
        torch.testing.assert_close(out, _moe(x, idx, weights, w))
        out.sum().backward()
    assert counter.frame_count == 1
