"""The C++ kernels of fp8_gemm / fp8_bmm / fp8_einsum / m_grouped_fp8_gemm do the whole call in one parallel
region (issue 51): each column block's task zeroes its part of the FP32 accumulator (or starts from c), accumulates,
and rounds its finished values into the output, for the streaming path (a few rows of A) and the panel path, one
block or many per job; the m-grouped GEMM's rows that no group owns are zero.

The accumulator is fresh memory: the allocator is dirtied with NaN first, so a block left unzeroed shows. The
output in BF16 must be the FP32 output rounded (the same accumulator, rounded once), at one thread and at two."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fp8_gemm.specs import _FORMATS, fp8_einsum_reference, quantize, quantize_einsum_operand
from tests.fp8_gemm.test_fp8_strides import deq64
from tests.grouped.specs import ids_layout, psum_layout
from torch_ascend_moe.backends.portable import fp8_linear as portable_linear
from torch_ascend_moe.backends.portable import grouped as portable_grouped

ops = torch.ops.ascend_moe  # the eager C++ kernels on CPU


def _dirty(numel: int) -> None:
    """Leave freed NaN-filled blocks of about these sizes behind, for the next allocations to reuse."""
    for n in (numel, 2 * numel, numel // 2 + 1):
        torch.full((n,), float("nan")).add_(1)


def _at_threads(threads: int, call):
    """call() at this many intra-op threads, on a dirtied allocator. (The panel path's column blocks are sized by
    the thread count, and MKL's SGEMM rounds a block's sums by its width: so the bits may differ between thread
    counts, each within the bound.)"""
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        _dirty(1 << 16)
        return call()
    finally:
        torch.set_num_threads(saved)


def _check(out32, out16, ref64, bound):
    assert out32.dtype == torch.float32 and out16.dtype == torch.bfloat16
    assert ((out32.double() - ref64).abs() <= bound).all(), ((out32.double() - ref64).abs() - bound).max()
    assert torch.equal(out16, out32.to(torch.bfloat16))


@settings(max_examples=60, deadline=None)
@given(
    fmt=st.integers(0, len(_FORMATS) - 1),
    m=st.one_of(st.integers(1, 8), st.integers(9, 40)),  # the streaming path, the panel path
    n=st.one_of(st.integers(1, 64), st.integers(500, 700)),  # one block, several
    k_blocks=st.integers(0, 2),
    with_c=st.booleans(),
    alpha=st.sampled_from([1.0, -0.5, 2.0]),
    batch=st.sampled_from([None, 1, 3]),
    seed=st.integers(0, 2**16),
)
def test_gemm_and_bmm_zero_accumulate_round_in_tasks(fmt, m, n, k_blocks, with_c, alpha, batch, seed):
    _, fa, fb = _FORMATS[fmt]
    k = max(fa[2], fb[2]) * k_blocks
    g = torch.Generator().manual_seed(seed)
    lead = () if batch is None else (batch,)
    groups = [
        quantize(torch.randn(m, k, generator=g), fa) + quantize(torch.randn(n, k, generator=g), fb)
        for _ in range(batch or 1)
    ]
    a, sfa, b, sfb = (torch.stack([grp[i] for grp in groups]) for i in (0, 1, 3, 4))
    ra, rb = groups[0][2], groups[0][5]
    if batch is None:
        a, sfa, b, sfb = a[0], sfa[0], b[0], sfb[0]
    c16 = (torch.randn(*lead, m, n, generator=g) * 4).bfloat16() if with_c else None
    op = ops.fp8_gemm if batch is None else ops.fp8_bmm

    def run(dtype):
        c = None if c16 is None else c16.to(dtype)
        return lambda: op(a, sfa, b, sfb, c, ra, rb, alpha, dtype)

    a64, b64 = deq64(a, sfa, ra), deq64(b, sfb, rb)
    ref = alpha * (a64 @ b64.transpose(-1, -2)) + (0 if c16 is None else c16.double())
    bound = 1e-5 * abs(alpha) * (a64.abs() @ b64.abs().transpose(-1, -2)) + 1e-30
    if c16 is not None:
        bound = bound + 1e-6 * c16.double().abs()
    for t in (1, 2):
        _check(_at_threads(t, run(torch.float32)), _at_threads(t, run(torch.bfloat16)), ref, bound)


@settings(max_examples=40, deadline=None)
@given(
    eq=st.sampled_from(["bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr"]),
    sizes=st.fixed_dictionaries({c: st.integers(1, 40) for c in "bdr"}),
    h=st.integers(1, 3),
    k_blocks=st.integers(1, 3),
    with_c=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_einsum_writes_through_the_permuted_output(eq, sizes, h, k_blocks, with_c, seed):
    sa, sb, so = eq[0:3], eq[4:7], eq[9:]
    contracted = next(c for c in sa if c in sb and c not in so)
    sizes = dict(sizes, h=h, **{contracted: 128 * k_blocks})  # K: whole scale blocks
    recipe_a, recipe_b = [1, 128], [1, 128] if so == "hdr" else [128, 128]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn([sizes[c] for c in sa], generator=g)
    w = torch.randn([sizes[c] for c in sb], generator=g)
    a, sfa = quantize_einsum_operand(x, sa, so, recipe_a, False)
    b, sfb = quantize_einsum_operand(w, sb, so, recipe_b, False)
    c16 = (torch.randn([sizes[c] for c in so], generator=g) * 4).bfloat16() if with_c else None

    def run(dtype):
        c = None if c16 is None else c16.to(dtype)
        return lambda: ops.fp8_einsum(eq, a, sfa, b, sfb, c, recipe_a, recipe_b, 0.75, dtype)

    ref = fp8_einsum_reference(eq, a, sfa, b, sfb, None if c16 is None else c16.float(), recipe_a, recipe_b, 0.75, None)
    # |a| and |b| (as FP32 values; the reference only reads them as numbers) bound the accumulation error
    scale = fp8_einsum_reference(
        eq, a.float().abs(), sfa.abs(), b.float().abs(), sfb.abs(), None, recipe_a, recipe_b, 0.75, None
    )
    bound = 1e-5 * scale + 1e-30 + (0 if c16 is None else 1e-6 * c16.double().abs())
    for t in (1, 2):
        _check(_at_threads(t, run(torch.float32)), _at_threads(t, run(torch.bfloat16)), ref, bound)


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    alignment=st.sampled_from([1, 8, 32]),
    psum=st.booleans(),
    extra_rows=st.integers(0, 9),
    n=st.one_of(st.integers(1, 64), st.integers(500, 700)),
    seed=st.integers(0, 2**16),
)
def test_m_grouped_rows_of_no_group_are_zero(counts, alignment, psum, extra_rows, n, seed):
    """Padding rows, -1 rows and rows past the last group are zero; the groups' rows are their products."""
    _, fa, fb = _FORMATS[0]
    g = torch.Generator().manual_seed(seed)
    if psum:
        layout, rows = psum_layout(counts, alignment)
    else:
        layout = ids_layout(counts, alignment)
        rows = layout.numel()
    rows += extra_rows
    if not psum:  # rows past the last group: -1
        layout = torch.cat([layout, torch.full((extra_rows,), -1, dtype=layout.dtype)])
    a, sfa, ra = quantize(torch.randn(rows, 256, generator=g), fa)
    parts = [quantize(torch.randn(n, 256, generator=g), fb) for _ in counts]
    b, sfb, rb = torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]), parts[0][2]

    def run(dtype):
        return lambda: ops.m_grouped_fp8_gemm(a, sfa, b, sfb, layout, psum, alignment, ra, rb, dtype)

    a64, b64 = deq64(a, sfa, ra), deq64(b, sfb, rb)
    ref = torch.zeros(rows, n, dtype=torch.float64)
    bound = torch.zeros(rows, n, dtype=torch.float64)
    ends = layout.tolist() if psum else None
    start = 0
    for grp in range(len(counts)):
        if psum:
            start = -(-start // alignment) * alignment
            owned = torch.zeros(rows, dtype=torch.bool)
            owned[start : ends[grp]] = True
            start = ends[grp]
        else:
            owned = layout == grp
        ref[owned] = a64[owned] @ b64[grp].T
        bound[owned] = 1e-5 * (a64[owned].abs() @ b64[grp].abs().T)
    unowned = (ref == 0) & (bound == 0)
    for t in (1, 2):
        out32, out16 = _at_threads(t, run(torch.float32)), _at_threads(t, run(torch.bfloat16))
        _check(out32, out16, ref, bound + 1e-30)
        assert (out32[unowned] == 0).all() and (out16[unowned] == 0).all()


@settings(max_examples=30, deadline=None)
@given(
    masked=st.lists(st.integers(0, 20), min_size=1, max_size=3),
    extra=st.integers(0, 12),
    n=st.one_of(st.integers(1, 64), st.integers(500, 700)),
    seed=st.integers(0, 2**16),
)
def test_m_grouped_masked_rows_past_the_mask_are_zero(masked, extra, n, seed):
    _, fa, fb = _FORMATS[0]
    g = torch.Generator().manual_seed(seed)
    m = max(masked) + extra
    parts_a = [quantize(torch.randn(m, 256, generator=g), fa) for _ in masked]
    parts_b = [quantize(torch.randn(n, 256, generator=g), fb) for _ in masked]
    a, sfa, ra = torch.stack([p[0] for p in parts_a]), torch.stack([p[1] for p in parts_a]), parts_a[0][2]
    b, sfb, rb = torch.stack([p[0] for p in parts_b]), torch.stack([p[1] for p in parts_b]), parts_b[0][2]
    masked_m = torch.tensor(masked, dtype=torch.int32)

    def run(dtype):
        return lambda: ops.m_grouped_fp8_gemm_masked(a, sfa, b, sfb, masked_m, ra, rb, dtype)

    a64, b64 = deq64(a, sfa, ra), deq64(b, sfb, rb)
    keep = (torch.arange(m)[None, :] < masked_m[:, None]).unsqueeze(-1).double()
    ref = (a64 @ b64.transpose(-1, -2)) * keep
    bound = 1e-5 * (a64.abs() @ b64.abs().transpose(-1, -2)) * keep + 1e-30
    past = (keep == 0).expand(ref.shape)
    for t in (1, 2):
        out32, out16 = _at_threads(t, run(torch.float32)), _at_threads(t, run(torch.bfloat16))
        _check(out32, out16, ref, bound)
        assert (out32[past] == 0).all() and (out16[past] == 0).all()


@settings(max_examples=25, deadline=None)
@given(
    counts=st.lists(st.integers(0, 24), min_size=1, max_size=3),
    n=st.sampled_from([128, 256]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    with_bias=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_fp8_linear_family_rounds_in_tasks(counts, n, dtype, with_bias, seed):
    """fp8_linear (bias as the accumulator's start), fp8_quant_gemm and m_grouped_fp8_linear (padding rows zero)
    on a dirtied allocator, against the portable kernels."""
    g = torch.Generator().manual_seed(seed)
    layout = torch.cat([ids_layout(counts, 8), torch.full((3,), -1, dtype=torch.int32)])
    rows = layout.numel()
    x = torch.randn(rows, 256, generator=g).to(dtype)
    weight = torch.randn(len(counts), n, 256, generator=g).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype) if with_bias else None
    c = torch.randn(rows, n, generator=g).to(dtype) if with_bias else None
    b, sfb, rb = quantize(weight[0].float(), _FORMATS[0][2])
    calls = [
        (ops.fp8_linear, portable_linear.fp8_linear, (x, weight[0], bias, 128, False, True)),
        (ops.fp8_quant_gemm, portable_linear.fp8_quant_gemm, (x, b, sfb, c, 128, rb, False, 1.0, dtype)),
        (
            ops.m_grouped_fp8_linear,
            portable_grouped.m_grouped_fp8_linear,
            (x, weight, layout, False, 8, 128, False, True),
        ),
    ]
    for ours, reference, args in calls:
        expected = reference(*args)
        for t in (1, 2):
            out = _at_threads(t, lambda: ours(*args))  # noqa: B023  (called at once)
            torch.testing.assert_close(out, expected, rtol=1e-2, atol=1e-2 * expected.abs().max().item() + 1e-6)
            if ours is ops.m_grouped_fp8_linear:
                assert (out[layout == -1] == 0).all()
