"""NaN in, NaN out (issue 14.2), for every FP8/FP4 op and the casts in quant/: a NaN anywhere in an input
gives NaN in exactly the output entries it reaches, as PyTorch's float8 casts and an fp64 product do.

A NaN reaches: through an E4M3 NaN code (0x7F/0xFF) or a NaN scale (FP32 NaN, UE8M0 0xFF), every value of
its scale block; through a product, every output entry that contracts with it; through an in-op cast, the
whole block it is quantized in (the block's amax, and so its scale, is NaN)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fp8_gemm.specs import _FORMATS, quantize, quantize_einsum_operand
from tests.grouped.specs import psum_layout
from torch_ascend_moe import quant
from torch_ascend_moe.backends.portable import fp8_gemm as portable
from torch_ascend_moe.backends.portable import fp8_linear as portable_linear
from torch_ascend_moe.backends.portable import grouped as portable_grouped

ops = torch.ops.ascend_moe  # the eager C++ kernels on CPU


def nan_mask(x: torch.Tensor, sf: torch.Tensor, recipe) -> torch.Tensor:
    """Where deq(x) is NaN, decoded by PyTorch's casts (E4M3 NaN codes, NaN or 0xFF UE8M0 scales)."""
    values = quant.decode_e2m1(quant.unpack_e2m1(x)) if x.dtype == torch.uint8 else x.float()
    gmn, gk = recipe
    scales = sf.float().repeat_interleave(gmn, dim=-2)[..., : values.shape[-2], :].repeat_interleave(gk, dim=-1)
    return (values * scales).isnan()


def reached(equation: str, nan_a: torch.Tensor, nan_b: torch.Tensor) -> torch.Tensor:
    """Output entries that contract with a NaN of either operand."""
    a, b = nan_a.double(), nan_b.double()
    return (torch.einsum(equation, a, torch.ones_like(b)) + torch.einsum(equation, torch.ones_like(a), b)) > 0


@st.composite
def poison(draw, x: torch.Tensor, sf: torch.Tensor):
    """x and sf with one NaN put in: an E4M3 NaN code, a NaN FP32 scale or a 0xFF UE8M0 scale."""
    x, sf = x.clone(), sf.clone()
    kinds = ["scale", "e8m0"] + ([] if x.dtype == torch.uint8 else ["code"])
    kind = draw(st.sampled_from(kinds))
    target = x if kind == "code" else sf
    index = tuple(draw(st.integers(0, s - 1)) for s in target.shape)
    if kind == "code":
        x.view(torch.uint8)[index] = draw(st.sampled_from([0x7F, 0xFF]))
    elif kind == "scale":
        sf[index] = float("nan")
    else:
        codes = sf.to(torch.float8_e8m0fnu).view(torch.uint8)  # the scales rounded to powers of two
        codes[index] = 0xFF
        sf = codes.view(torch.float8_e8m0fnu)
    return x, sf


@st.composite
def pair(draw, batch: int | None = None):
    """Quantized (a, sfa, ra, b, sfb, rb) in one of the formats with a NaN in a or in b (or both)."""
    _, fa, fb = _FORMATS[draw(st.integers(0, len(_FORMATS) - 1))]
    k = max(fa[2], fb[2]) * draw(st.integers(1, 2))
    m, n = draw(st.integers(1, 10)), draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    out = []
    for rows, fmt in ((m, fa), (n, fb)):
        lead = () if batch is None else (batch,)
        parts = [quantize(torch.randn(rows, k, generator=g), fmt) for _ in range(batch or 1)]
        x = torch.stack([p[0] for p in parts]) if lead else parts[0][0]
        sf = torch.stack([p[1] for p in parts]) if lead else parts[0][1]
        out.append([x, sf, parts[0][2]])
    for i in draw(st.sampled_from([[0], [1], [0, 1]])):
        out[i][0], out[i][1] = draw(poison(out[i][0], out[i][1]))
    return (*out[0], *out[1])


def assert_nan_exactly(out: torch.Tensor, expected: torch.Tensor) -> None:
    assert expected.any()
    assert torch.equal(out.isnan(), expected), (out, expected)


@settings(max_examples=40, deadline=None)
@given(case=pair())
def test_fp8_gemm_nan(case):
    a, sfa, ra, b, sfb, rb = case
    expected = reached("mk,nk->mn", nan_mask(a, sfa, ra), nan_mask(b, sfb, rb))
    for fn in (ops.fp8_gemm, portable.fp8_gemm):
        for out_dtype in (torch.float32, torch.bfloat16):
            assert_nan_exactly(fn(a, sfa, b, sfb, None, ra, rb, 1.0, out_dtype), expected)


@settings(max_examples=30, deadline=None)
@given(case=pair(batch=2))
def test_fp8_bmm_nan(case):
    a, sfa, ra, b, sfb, rb = case
    expected = reached("gmk,gnk->gmn", nan_mask(a, sfa, ra), nan_mask(b, sfb, rb))
    for fn in (ops.fp8_bmm, portable.fp8_bmm):
        assert_nan_exactly(fn(a, sfa, b, sfb, None, ra, rb, 1.0, torch.float32), expected)


@settings(max_examples=30, deadline=None)
@given(case=pair(batch=2), split=st.integers(0, 10))
def test_m_grouped_fp8_gemm_nan(case, split):
    a, sfa, ra, b, sfb, rb = case
    a, sfa = a[0], sfa[0]
    m = a.shape[0]
    counts = [min(split, m), m - min(split, m)]
    layout, _ = psum_layout(counts, 1)
    nan_a, nan_b = nan_mask(a, sfa, ra), nan_mask(b, sfb, rb)
    group = torch.repeat_interleave(torch.arange(2), torch.tensor(counts))
    expected = reached("mk,mnk->mn", nan_a, nan_b[group])
    if not expected.any():  # the NaN sits in an expert no row is routed to
        return
    for fn in (ops.m_grouped_fp8_gemm, portable_grouped.m_grouped_fp8_gemm):
        assert_nan_exactly(fn(a, sfa, b, sfb, layout, True, 1, ra, rb, torch.float32), expected)
    masked_m = torch.tensor([m, m], dtype=torch.int32)
    a2, sfa2 = torch.stack([a, a]), torch.stack([sfa, sfa])
    expected2 = reached("gmk,gnk->gmn", torch.stack([nan_a, nan_a]), nan_b)
    for fn in (ops.m_grouped_fp8_gemm_masked, portable_grouped.m_grouped_fp8_gemm_masked):
        assert_nan_exactly(fn(a2, sfa2, b, sfb, masked_m, ra, rb, torch.float32), expected2)


def _einsum_nan(x: torch.Tensor, sf: torch.Tensor, subs: str, out: str, recipe) -> torch.Tensor:
    """Where deq(x) of an einsum operand is NaN: scale blocks of gran_mn along its output letter, gran_k
    along the contracted one."""
    for dim, letter in enumerate(subs):
        if letter != "h":
            gran = recipe[0] if letter in out else recipe[1]
            sf = sf.float().repeat_interleave(gran, dim=dim).narrow(dim, 0, x.shape[dim])
    return (x.float() * sf).isnan()


@pytest.mark.parametrize("equation", ["bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr"])
@pytest.mark.parametrize("where", ["a", "b"])
@pytest.mark.parametrize("how", ["input", "code"])
def test_fp8_einsum_nan(equation, where, how):
    """A NaN input (a NaN scale after the cast) or an E4M3 NaN code in the quantized data."""
    sa, sb, so = equation[0:3], equation[4:7], equation[9:]
    contracted = (set(sa) & set(sb)) - set(so)
    sizes = {c: 128 if c in contracted else 3 for c in "bhrd"}
    g = torch.Generator().manual_seed(5)
    recipe_a, recipe_b = [1, 128], [1, 128]
    x = torch.randn([sizes[c] for c in sa], generator=g)
    w = torch.randn([sizes[c] for c in sb], generator=g)
    if how == "input":
        (x if where == "a" else w)[1, 1, 2] = float("nan")
    a, sfa = quantize_einsum_operand(x, sa, so, recipe_a, False)
    b, sfb = quantize_einsum_operand(w, sb, so, recipe_b, False)
    if how == "code":
        (a if where == "a" else b).view(torch.uint8)[1, 1, 2] = 0x7F
    expected = reached(equation, _einsum_nan(a, sfa, sa, so, recipe_a), _einsum_nan(b, sfb, sb, so, recipe_b))
    for fn in (ops.fp8_einsum, portable.fp8_einsum):
        assert_nan_exactly(fn(equation, a, sfa, b, sfb, None, recipe_a, recipe_b, 1.0, torch.float32), expected)


def _block_nan(x: torch.Tensor, block) -> torch.Tensor:
    """Entries of x whose (rows x cols) cast block holds a NaN."""
    gr, gc = block
    m, n = x.shape
    padded = torch.nn.functional.pad(x.isnan().float(), (0, (-n) % gc, 0, (-m) % gr))
    blocks = padded.view(padded.shape[0] // gr, gr, padded.shape[1] // gc, gc).amax(dim=(1, 3)) > 0
    return blocks.repeat_interleave(gr, 0).repeat_interleave(gc, 1)[:m, :n]


@st.composite
def high_precision(draw, rows_max: int = 12):
    m, n, kb = draw(st.integers(1, rows_max)), draw(st.integers(1, 6)), draw(st.integers(1, 2))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    x = torch.randn(m, 128 * kb, generator=g)
    w = torch.randn(n, 128 * kb, generator=g)
    target = draw(st.sampled_from(["x", "w"]))
    t = x if target == "x" else w
    t[draw(st.integers(0, t.shape[0] - 1)), draw(st.integers(0, t.shape[1] - 1))] = float("nan")
    return x.to(dtype), w.to(dtype), draw(st.booleans())


@settings(max_examples=30, deadline=None)
@given(case=high_precision())
def test_fp8_quant_gemm_nan(case):
    x, w, ue8m0 = case
    b, sfb, rb = quantize(w.float(), _FORMATS[0][2])
    expected = reached("mk,nk->mn", _block_nan(x.float(), (1, 128)), nan_mask(b, sfb, rb))
    for fn in (ops.fp8_quant_gemm, portable_linear.fp8_quant_gemm):
        assert_nan_exactly(fn(x, b, sfb, None, 128, rb, ue8m0, 1.0, torch.float32), expected)


@settings(max_examples=30, deadline=None)
@given(case=high_precision())
def test_fp8_linear_nan(case):
    x, w, ue8m0 = case
    nan_x, nan_w = _block_nan(x.float(), (1, 128)), _block_nan(w.float(), (128, 128))
    expected = reached("mk,nk->mn", nan_x, nan_w)
    for fn in (ops.fp8_linear, portable_linear.fp8_linear):
        assert_nan_exactly(fn(x, w, None, 128, ue8m0, True), expected)


@pytest.mark.parametrize("fp8_backward", [True, False])
@pytest.mark.parametrize("ue8m0", [False, True])
def test_fp8_linear_backward_nan(fp8_backward, ue8m0):
    """A NaN in x[m, k] reaches out[m, :] forward, and grad_w[:, k] backward (wgrad contracts the tokens);
    grad_x = grad @ W never meets it."""
    g = torch.Generator().manual_seed(9)
    x = torch.randn(6, 256, generator=g)
    x[2, 130] = float("nan")
    x.requires_grad_(True)
    w = torch.randn(5, 256, generator=g).requires_grad_(True)
    out = ops.fp8_linear(x, w, None, 128, ue8m0, fp8_backward)
    expected = torch.zeros(6, 5, dtype=torch.bool)
    expected[2] = True
    assert_nan_exactly(out, expected)
    out.backward(torch.ones_like(out))
    assert not x.grad.isnan().any()
    expected_w = torch.zeros(5, 256, dtype=torch.bool)
    expected_w[:, 130] = True
    assert_nan_exactly(w.grad, expected_w)


@settings(max_examples=30, deadline=None)
@given(case=high_precision(rows_max=10), split=st.integers(0, 10))
def test_m_grouped_fp8_linear_nan(case, split):
    x, w, ue8m0 = case
    m = x.shape[0]
    counts = [min(split, m), m - min(split, m)]
    layout, _ = psum_layout(counts, 1)
    weight = torch.stack([w, w.nan_to_num()])  # the NaN (if in w) sits in expert 0 only
    group = torch.repeat_interleave(torch.arange(2), torch.tensor(counts))
    nan_w = torch.stack([_block_nan(weight[i].float(), (128, 128)) for i in range(2)])
    expected = reached("mk,mnk->mn", _block_nan(x.float(), (1, 128)), nan_w[group])
    if not expected.any():  # a NaN in expert 0 with no row routed to it
        return
    for fn in (ops.m_grouped_fp8_linear, portable_grouped.m_grouped_fp8_linear):
        assert_nan_exactly(fn(x, weight, layout, True, 1, 128, ue8m0, True), expected)


_CASTS = [
    ("per_token", lambda x, u: quant.per_token_cast_to_fp8(x, u), lambda q, s: quant.dequantize_fp8(q, s, 1, 128)),
    ("per_channel", lambda x, u: quant.per_channel_cast_to_fp8(x, u), lambda q, s: quant.dequantize_fp8(q, s, 128, 1)),
    ("per_block", lambda x, u: quant.per_block_cast_to_fp8(x, u), lambda q, s: quant.dequantize_fp8(q, s, 128, 128)),
    ("fp4", lambda x, u: quant.per_token_cast_to_fp4(x, u), lambda q, s: quant.cast_back_from_fp4(q, s)),
    (
        "fp4 packed ue8m0",
        lambda x, u: quant.per_token_cast_to_fp4(x, True, use_packed_ue8m0=True),
        lambda q, s: quant.cast_back_from_fp4(q, s, use_packed_ue8m0=True),
    ),
    (
        "per_token packed ue8m0",
        lambda x, u: quant.per_token_cast_to_fp8(x, True, use_packed_ue8m0=True),
        lambda q, s: quant.dequantize_fp8(q, quant.unpack_ue8m0_from_int(s), 1, 128),
    ),
]
_CAST_BLOCKS = {"per_token": (1, 128), "per_channel": (128, 1), "per_block": (128, 128)}


@settings(max_examples=40, deadline=None)
@given(cast=st.sampled_from(_CASTS), ue8m0=st.booleans(), data=st.data())
def test_casts_nan(cast, ue8m0, data):
    name, fn, back = cast
    rows = 128 if name == "per_channel" else data.draw(st.integers(1, 6))
    x = torch.randn(rows, 512)
    x[data.draw(st.integers(0, rows - 1)), data.draw(st.integers(0, 511))] = float("nan")
    block = _CAST_BLOCKS.get(name.split()[0], (1, 128))
    assert torch.equal(back(*fn(x, ue8m0)).isnan(), _block_nan(x, block))


def test_per_custom_dims_cast_nan():
    x = torch.randn(4, 64)
    x[1, 3] = float("nan")
    for ue8m0 in (False, True):
        q, sf = quant.per_custom_dims_cast_to_fp8(x, (0,), ue8m0)
        expected = torch.zeros(4, 64, dtype=torch.bool)
        expected[1] = True
        assert torch.equal((q.float() * sf[:, None]).isnan(), expected)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), counts=st.lists(st.integers(0, 40), min_size=1, max_size=3), ue8m0=st.booleans())
def test_k_grouped_fp8_gemm_nan(data, counts, ue8m0):
    """k-grouped: a NaN code or scale in a group's rows reaches that group's output only (the fp64
    reference, which decodes with PyTorch's casts, propagates it the same way)."""
    from tests.grouped.specs import k_grouped_fp8_reference, k_grouped_quantize

    layout, rows = psum_layout(counts, 8)
    if rows == 0:
        return
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    a, sfa = k_grouped_quantize(torch.randn(rows, 4, generator=g), layout, 8, 32, ue8m0)
    b, sfb = k_grouped_quantize(torch.randn(rows, 3, generator=g), layout, 8, 32, ue8m0)
    a, sfa = data.draw(poison(a, sfa))
    args = (a, sfa, b, sfb, layout, len(counts), 8, 32, None, torch.float32)
    expected = k_grouped_fp8_reference(*args).isnan()
    if not expected.any():  # the NaN code sits in a gap row no group reads
        return
    for fn in (ops.k_grouped_fp8_gemm, portable_grouped.k_grouped_fp8_gemm):
        assert_nan_exactly(fn(*args), expected)
