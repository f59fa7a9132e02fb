"""torch_ascend_moe.deep_gemm's grouped GEMMs with upstream's calling conventions."""

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from tests.grouped.specs import ids_layout, psum_layout
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


def _segments():
    start = 0
    for g, count in enumerate(COUNTS):
        start = -(-start // ALIGN) * ALIGN
        yield g, start, start + count
        start += count


def _reference(a, b):
    rows = a.shape[0]
    ref = torch.zeros(rows, b.shape[1], dtype=torch.float64)
    for g, s, e in _segments():
        ref[s:e] = a[s:e].double() @ b[g].double().T
    return ref


def _inputs(seed=0, k=128, n=64):
    g = torch.Generator().manual_seed(seed)
    _, rows = psum_layout(COUNTS, ALIGN)
    return torch.randn(rows, k, generator=g), torch.randn(len(COUNTS), n, k, generator=g)


def test_bf16_ids_and_psum_layouts():
    a, b = (t.bfloat16() for t in _inputs())
    ref = _reference(a, b)
    ids = ids_layout(COUNTS, ALIGN)
    psum, _ = psum_layout(COUNTS, ALIGN)
    for layout, use_psum in ((ids, False), (psum, True)):
        d = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16)
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=use_psum)
        assert calc_diff(d, ref) < 1e-5  # padding rows included: zero in both
    d_nn = torch.empty_like(d)
    deep_gemm.m_grouped_bf16_gemm_nn_contiguous(a, b.transpose(1, 2).contiguous(), d_nn, psum, use_psum_layout=True)
    assert torch.equal(d_nn, d)


def test_psum_gaps_untouched_without_ensure_zero_padding():
    # (-1 rows of an id layout are always written: tests/grouped/test_deep_gemm_grouped_padding.py)
    a, b = (t.bfloat16() for t in _inputs(1))
    layout = psum_layout(COUNTS, ALIGN)[0]
    d = torch.full((a.shape[0], b.shape[1]), 7.0, dtype=torch.bfloat16)
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=True, ensure_zero_padding=False)
    owned = torch.zeros(a.shape[0], dtype=torch.bool)
    for g, s, e in _segments():
        owned[s:e] = True
        assert calc_diff(d[s:e], a[s:e].double() @ b[g].double().T) < 1e-5 if e > s else True
    assert (d[~owned] == 7).all()


@pytest.mark.parametrize("fp8", [False, True])
def test_psum_rows_past_the_last_group_untouched_with_ensure_zero_padding(fp8):
    """A (DeepEP-style) buffer with more rows than were received: with ``ensure_zero_padding`` the gaps up to the
    last group's aligned end are zeros, and rows after it keep their contents (upstream's psum scheduler stops
    after the last group)."""
    x, w = _inputs(3)
    layout, aligned_end = psum_layout(COUNTS, ALIGN)
    x = torch.cat([x, torch.randn(2 * ALIGN + 5, x.shape[1])])  # rows no group reaches
    d = torch.full((x.shape[0], w.shape[1]), 7.0, dtype=torch.bfloat16)
    if fp8:
        parts = [quant.per_block_cast_to_fp8(w[g], False) for g in range(w.shape[0])]
        b = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
        a = quant.per_token_cast_to_fp8(x, use_ue8m0=False)
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=True, ensure_zero_padding=True)
    else:
        a, b = x.bfloat16(), w.bfloat16()
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, layout, use_psum_layout=True, ensure_zero_padding=True)
    owned = torch.zeros(x.shape[0], dtype=torch.bool)
    for g, s, e in _segments():
        owned[s:e] = True
        if e > s:
            assert calc_diff(d[s:e], x[s:e].double() @ w[g].double().T) < (1e-3 if fp8 else 1e-5)
    gaps = ~owned
    gaps[aligned_end:] = False
    assert (d[gaps] == 0).all() and int(gaps.sum()) > 0
    assert (d[aligned_end:] == 7).all()


@pytest.mark.parametrize("fp4", [False, True])
def test_fp8_and_fp4_contiguous(fp4):
    x, w = _inputs(2, k=256)
    a = quant.per_token_cast_to_fp8(x, use_ue8m0=fp4, gran_k=32 if fp4 else 128)
    if fp4:
        parts = [quant.per_token_cast_to_fp4(w[g], True, gran_k=32) for g in range(w.shape[0])]
        recipe = {"recipe_a": (1, 32), "recipe_b": (1, 32)}
    else:
        parts = [quant.per_block_cast_to_fp8(w[g], False) for g in range(w.shape[0])]
        recipe = {}
    b = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])
    psum, _ = psum_layout(COUNTS, ALIGN)
    d = torch.empty(x.shape[0], w.shape[1], dtype=torch.bfloat16)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a, b, d, psum, use_psum_layout=True, **recipe)
    for g, s, e in _segments():
        if e > s:
            assert calc_diff(d[s:e], x[s:e].double() @ w[g].double().T) < (1e-2 if fp4 else 1e-3)
    if not fp4:  # the nn form: B given [G, K, N] with its scales transposed
        d_nn = torch.empty_like(d)
        b_nn = (b[0].transpose(1, 2).contiguous(), b[1].transpose(1, 2).contiguous())
        deep_gemm.m_grouped_fp8_gemm_nn_contiguous(a, b_nn, d_nn, psum, use_psum_layout=True)
        assert torch.equal(d_nn, d)


def test_masked_rows_beyond_masked_m_untouched():
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, 16, 128, generator=g), torch.randn(3, 24, 128, generator=g)
    masked = torch.tensor([16, 0, 5], dtype=torch.int32)
    d = torch.full((3, 16, 24), 5.0, dtype=torch.bfloat16)
    deep_gemm.m_grouped_bf16_gemm_nt_masked(a.bfloat16(), b.bfloat16(), d, masked, expected_m=8)
    fa = [quant.per_token_cast_to_fp8(a[i], False) for i in range(3)]
    fb = [quant.per_block_cast_to_fp8(b[i], False) for i in range(3)]
    d8 = torch.full((3, 16, 24), 5.0, dtype=torch.bfloat16)
    deep_gemm.fp8_m_grouped_gemm_nt_masked(
        (torch.stack([x[0] for x in fa]), torch.stack([x[1] for x in fa])),
        (torch.stack([x[0] for x in fb]), torch.stack([x[1] for x in fb])),
        d8,
        masked,
        expected_m=8,
    )
    for grp, m in enumerate(masked.tolist()):
        ref = a[grp, :m].double() @ b[grp].double().T
        if m:
            assert calc_diff(d[grp, :m], ref) < 1e-5 and calc_diff(d8[grp, :m], ref) < 1e-3
        assert (d[grp, m:] == 5).all() and (d8[grp, m:] == 5).all()


@pytest.mark.parametrize("use_psum", [False, True])
def test_k_grouped_accumulates_in_place(use_psum):
    g = torch.Generator().manual_seed(4)
    ks = [64, 0, 96, 32]
    if use_psum:
        layout, rows = psum_layout([60, 0, 90, 20], ALIGN)
        ranges = [(s, e) for _, s, e in _segments_of([60, 0, 90, 20])]
    else:
        layout, rows = torch.tensor(ks, dtype=torch.int32), sum(ks)
        ends = torch.tensor(ks).cumsum(0).tolist()
        ranges = list(zip([0] + ends[:-1], ends))
    a, b = torch.randn(rows, 24, generator=g).bfloat16(), torch.randn(rows, 40, generator=g).bfloat16()
    c = 10 * torch.randn(4, 24, 40, generator=g)
    d = c.clone()
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(
        a, b, d, None if use_psum else ks, layout, c=d, use_psum_layout=use_psum
    )
    for grp, (s, e) in enumerate(ranges):
        ref = c[grp].double() + a[s:e].double().T @ b[s:e].double()
        assert calc_diff(d[grp], ref) < 1e-5


def _segments_of(counts):
    start = 0
    for g, count in enumerate(counts):
        start = -(-start // ALIGN) * ALIGN
        yield g, start, start + count
        start += count


def test_bad_inputs_and_aliases():
    a, b = (t.bfloat16() for t in _inputs(5))
    d = torch.empty(a.shape[0], b.shape[1], dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="argument 'expected_m_for_psum_layout'"):
        deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, b, d, ids_layout(COUNTS, ALIGN), expected_m_for_psum_layout=64)
    # Without c the product is written (DeepGEMM 2.8 on SM100); the group sizes must still cover A's rows.
    with pytest.raises(ValueError, match=r"argument 'ks_cpu' sum: expected 192, got 160"):
        deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, a, torch.empty(1, 128, 128), [160], torch.tensor([160]))
    out = torch.empty(1, a.shape[1], a.shape[1])
    deep_gemm.k_grouped_bf16_gemm_tn_contiguous(a, a, out, [a.shape[0]], torch.tensor([a.shape[0]]))
    torch.testing.assert_close(out[0], a.float().T @ a.float(), rtol=1e-5, atol=1e-3)
    assert deep_gemm.bf16_m_grouped_gemm_nt_masked is deep_gemm.m_grouped_bf16_gemm_nt_masked
    assert deep_gemm.get_m_alignment_for_contiguous_layout() == ALIGN


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("use_psum", [False, True])
def test_k_grouped_fp8_tn(packed, use_psum):
    from tests.grouped.specs import k_grouped_quantize

    g = torch.Generator().manual_seed(6)
    if use_psum:
        counts = [70, 0, 130, 33]
        layout, rows = psum_layout(counts, ALIGN)
        ranges = [(s, e) for _, s, e in _segments_of(counts)]
    else:
        ks = [128, 0, 256, 64]
        rows, ends = sum(ks), torch.tensor(ks).cumsum(0).tolist()
        layout, ranges = torch.tensor(ks, dtype=torch.int32), list(zip([0] + ends[:-1], ends))
    psum_ends = layout if use_psum else layout.cumsum(0).to(torch.int32)
    x, y = torch.randn(rows, 24, generator=g), torch.randn(rows, 40, generator=g)
    align = ALIGN if use_psum else 1
    a = k_grouped_quantize(x, psum_ends, align, 32, packed)
    b = k_grouped_quantize(y, psum_ends, align, 32, packed)
    if packed:  # upstream's SM100 format: 4 scale rows of a group per int32 row
        counts_k = [e - s for s, e in ranges]

        def pack(sf):
            out, off = [], 0
            for k in counts_k:
                n = -(-k // 32)
                part = torch.nn.functional.pad(sf[off : off + n], (0, 0, 0, (-n) % 4), value=1.0)
                out.append(quant.pack_ue8m0_to_int(part.T.contiguous()).T)
                off += n
            return torch.cat(out)

        a, b = (a[0], pack(a[1])), (b[0], pack(b[1]))
    c = 10 * torch.randn(4, 24, 40, generator=g)
    d = c.clone()
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous(
        a, b, d, None if use_psum else ks, layout, c=d, recipe=(1, 1, 32), use_psum_layout=use_psum
    )
    for grp, (s, e) in enumerate(ranges):
        ref = c[grp].double() + x[s:e].double().T @ y[s:e].double()
        assert calc_diff(d[grp], ref) < 1e-3, grp


def test_k_grouped_fp8_nt_flat_form_matches_tn():
    from tests.grouped.specs import k_grouped_quantize

    g = torch.Generator().manual_seed(7)
    ks = [128, 256]
    layout = torch.tensor(ks, dtype=torch.int32)
    x, y = torch.randn(384, 16, generator=g), torch.randn(384, 8, generator=g)
    ends = layout.cumsum(0).to(torch.int32)
    (xa, sa), (yb, sb) = (k_grouped_quantize(t, ends, 1, 128, False) for t in (x, y))
    d_tn = torch.zeros(2, 16, 8)
    deep_gemm.k_grouped_fp8_gemm_tn_contiguous((xa, sa), (yb, sb), d_tn, ks, layout, c=d_tn)

    def flat(data):  # each group as a row-major [MN, k_g] block, blocks concatenated
        parts, off = [], 0
        for k in ks:
            parts.append(data[off : off + k].T.contiguous().flatten())
            off += k
        return torch.cat(parts)

    d_nt = torch.zeros(2, 16, 8)
    deep_gemm.k_grouped_fp8_gemm_nt_contiguous((flat(xa), sa.T), (flat(yb), sb.T), d_nt, ks, layout, c=d_nt)
    assert torch.equal(d_nt, d_tn)
