"""The grouped family's Ascend adapters (backends/npu/grouped.py) against torch_npu's real schema and Meta kernel
(shapes, dtypes, strides under FakeTensorMode) and, through our CPU reference of npu_grouped_matmul
(tests/npu/grouped_refs.py), for values against the specs' fp64 references."""

from __future__ import annotations

import dataclasses
import importlib
from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.chains import labels, npu_chain
from tests.grouped.specs import SPECS
from torch_ascend_moe._registry import _schema, with_defaults
from torch_ascend_moe.backends.npu import grouped as adapters
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.harness import THRESHOLDS

ADAPTED = [s for s in SPECS if "torch_npu: npu_grouped_matmul" in labels(s.name, "npu")]
MX_ADAPTED = [s for s in SPECS if "torch_npu: npu_grouped_matmul (MX)" in labels(s.name, "npu")]
# Portable on Ascend, each with its reason in backends/npu/grouped.py (the swiglu op: its grouped GEMM still maps).
PORTABLE_ONLY = {"k_grouped_fp8_gemm", "m_grouped_bf16_gemm_swiglu", "m_grouped_fp8_gemm_swiglu"}
STEPS = {"m_grouped_fp8_linear", "m_grouped_fp8_quant_gemm"}  # portable: casts and grouped GEMM, dispatched


@pytest.fixture(scope="module")
def refs(npu_ops):
    """npu_ops with our CPU reference of npu_grouped_matmul registered."""
    return importlib.import_module("tests.npu.grouped_refs")


@pytest.fixture
def gmm_calls(monkeypatch):
    """How many times the adapters called npu_grouped_matmul (a sample must not silently take a fallback)."""
    calls = []
    real = adapters._gmm

    def counting(x, weight, group_list, group_type, output_dtype=None):
        # torch_npu's layout rules: M-grouped x row-major; K-grouped x the transposed view of a row-major [S, M].
        if group_type == 0:
            assert x.is_contiguous(), x.stride()
        else:
            assert x.T.is_contiguous() and weight.is_contiguous(), (x.stride(), weight.stride())
        assert group_list.dtype == torch.int64 and group_list.dim() == 1
        calls.append(group_type)
        return real(x, weight, group_list, group_type, output_dtype)

    monkeypatch.setattr(adapters, "_gmm", counting)
    return calls


def _samples(spec, dtype):
    return [*spec.sample_inputs("cpu", dtype), *spec.sample_inputs("cpu", dtype, small=True)]


def _cases(spec):
    """Every sample, in the spec's dtypes and FP16 (npu_grouped_matmul's third float input dtype)."""
    return [(dtype, s) for dtype in (*spec.dtypes, torch.float16) for s in _samples(spec, dtype)]


def _out_dtype_variants(spec):
    """Samples with an explicit out_dtype other than the input's (the FP32-then-round path)."""
    index = [a for a, _, _ in _schema(spec.name)].index("out_dtype")
    variants = []
    for dtype, s in _cases(spec):
        c = s.args[6] if spec.name == "k_grouped_bf16_gemm" else None
        for out in (torch.float32, torch.bfloat16, torch.float16):
            if out != dtype and c is None:
                args = list(s.args)
                args[index] = out
                variants.append((dtype, dataclasses.replace(s, args=tuple(args), name=f"{s.name} out={out}")))
    return variants


def test_registered_adapters():
    assert {s.name for s in ADAPTED} == {"m_grouped_bf16_gemm", "m_grouped_bf16_gemm_masked", "k_grouped_bf16_gemm"}
    assert {s.name for s in MX_ADAPTED} == {"m_grouped_fp8_gemm", "m_grouped_fp8_gemm_masked"}
    assert {s.name for s in SPECS} == {s.name for s in ADAPTED + MX_ADAPTED} | PORTABLE_ONLY | STEPS
    # No torch_npu adapter for these (DeepGEMM-Ascend's k-grouped FP8 GEMM, an upstream library, may come first)
    vendor = [[x for x in labels(name, "npu") if not x.startswith("deep_gemm.")] for name in STEPS | PORTABLE_ONLY]
    assert all(chain_ == ["portable"] for chain_ in vendor), vendor


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_meta_matches_our_fake(spec, npu_ops, gmm_calls):
    """Under FakeTensorMode the adapter runs torch_npu's own Meta kernel; its outputs match our op's fake."""
    cases = _cases(spec) + _out_dtype_variants(spec)
    for dtype, s in cases:
        with FakeTensorMode() as mode:
            args = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in s.args)
            ours = spec.op(*args)
            out = getattr(npu_chain, spec.name)(*args)
        where = f"{spec.name}[{s.name}, {dtype}]"
        assert out.shape == ours.shape, f"{where}: shape {list(out.shape)} != {list(ours.shape)}"
        assert out.dtype == ours.dtype, f"{where}: dtype {out.dtype} != {ours.dtype}"
        assert out.stride() == ours.stride(), f"{where}: strides {out.stride()} != {ours.stride()}"
    assert gmm_calls  # npu_grouped_matmul's meta ran (empty samples return zeros without a call)


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_values_match_reference(spec, refs, gmm_calls):
    """On CPU tensors (our reference kernel of npu_grouped_matmul), every sample is within the harness threshold
    of the spec's fp64 reference; rows no group owns are exact zeros; dtype and strides are our op's."""
    reference = with_defaults(spec.name, spec.reference)
    for dtype, s in _cases(spec) + _out_dtype_variants(spec):
        where = f"{spec.name}[{s.name}, {dtype}]"
        out = getattr(npu_chain, spec.name)(*s.args)
        ours = spec.op(*s.args)
        ref = reference(*s.args)
        assert out.shape == ref.shape and out.dtype == ours.dtype, where
        assert out.stride() == ours.stride(), f"{where}: strides {out.stride()} != {ours.stride()}"
        assert torch.isfinite(out).all(), f"{where}: non-finite values (a padding row leaked)"
        assert (out[ref == 0] == 0).all(), f"{where}: rows no group owns are not zeros"
        threshold = max(THRESHOLDS[dtype], THRESHOLDS[out.dtype])  # the coarser of input and output
        diff = calc_diff(out, ref)
        assert diff < threshold, f"{where}: calc_diff {diff:.3g} >= {threshold:g}"
        # Our op's own CPU kernel rounds the same FP32 sums once, to the output dtype: the two agree within the
        # output dtype's threshold (an FP32 output computed in BF16 would not).
        assert calc_diff(out, ours) < THRESHOLDS[out.dtype], where
    assert len(gmm_calls) >= len(_cases(spec)) - 2  # all but the empty samples reached npu_grouped_matmul
    assert {0, 2} & set(gmm_calls)


def test_strided_operands(refs, gmm_calls):
    """Column-major, sliced and broadcast operands reach npu_grouped_matmul in the layouts it takes (the
    counting fixture checks them), with our op's values."""
    layout = torch.tensor([4, 20], dtype=torch.int32)
    b = torch.randn(1, 6).expand(20, 6)  # stride 0 along S
    for a in (torch.randn(5, 20).T, torch.randn(20, 10)[:, ::2]):  # column-major; sliced columns
        out = npu_chain.k_grouped_bf16_gemm(a, b, layout, 2, True, 4, None, None)
        ref = torch.ops.ascend_moe.k_grouped_bf16_gemm(a.contiguous(), b.contiguous(), layout, 2, True, 4)
        assert calc_diff(out, ref) < THRESHOLDS[torch.float32]
    x, w = torch.randn(16, 12).T, torch.randn(2, 8, 16)[:, ::2]  # x column-major; w sliced along N
    m_layout = torch.tensor([4, 12], dtype=torch.int32)
    out = npu_chain.m_grouped_bf16_gemm(x, w, m_layout, True, 1, None)
    ref = torch.ops.ascend_moe.m_grouped_bf16_gemm(x.contiguous(), w.contiguous(), m_layout, True, 1)
    assert calc_diff(out, ref) < THRESHOLDS[torch.float32]
    # A column-major accumulator: the output is still row-major (our op's fake), with and without rows.
    c = torch.randn(2, 6, 5).transpose(1, 2)
    for a in (torch.randn(20, 5), torch.randn(0, 5)):
        rows = a.shape[0]
        ends = torch.tensor([min(4, rows), rows], dtype=torch.int32)
        out = npu_chain.k_grouped_bf16_gemm(a, b[:rows], ends, 2, True, 4, c, None)
        ref = torch.ops.ascend_moe.k_grouped_bf16_gemm(a, b[:rows].contiguous(), ends, 2, True, 4, c)
        assert out.is_contiguous() and calc_diff(out, ref) < THRESHOLDS[torch.float32]
    assert gmm_calls == [2, 2, 0, 2]


def test_float64_runs_the_portable_kernel(refs, gmm_calls):
    for spec in ADAPTED:
        reference = with_defaults(spec.name, spec.reference)
        for s in spec.sample_inputs("cpu", torch.float64):
            out = getattr(npu_chain, spec.name)(*s.args)
            assert out.dtype == torch.float64 and calc_diff(out, reference(*s.args)) < THRESHOLDS[torch.float64]
    assert not gmm_calls


@pytest.mark.parametrize("limit", ["MAX_GROUPS", "INNER_LIMIT"])
def test_beyond_documented_limits_runs_the_portable_kernel(refs, gmm_calls, monkeypatch, limit):
    """More groups than npu_grouped_matmul documents, or a too-long inner dimension: the portable kernel (the
    limits are lowered here to the samples' sizes)."""
    monkeypatch.setattr(adapters, limit, 1 if limit == "MAX_GROUPS" else 4)
    for spec in ADAPTED:
        reference = with_defaults(spec.name, spec.reference)
        for s in spec.sample_inputs("cpu", torch.float32):
            out = getattr(npu_chain, spec.name)(*s.args)
            assert calc_diff(out, reference(*s.args)) < THRESHOLDS[torch.float32]
    assert not gmm_calls


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (compared below)
        return e
    return None


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_bad_inputs_raise_our_errors(spec, refs):
    """The adapter fails exactly as our op does (signature checks first, then the layout value checks), eagerly
    and (checks that need no values) under FakeTensorMode."""
    for bad in spec.bad_inputs("cpu"):
        ours = _error(lambda bad=bad: spec.op(*bad.args))
        theirs = _error(lambda bad=bad: getattr(npu_chain, spec.name)(*bad.args))
        assert isinstance(ours, bad.error), (bad.name, ours)
        assert type(theirs) is type(ours) and str(theirs) == str(ours), (bad.name, theirs, ours)
        if bad.data_dependent:
            continue
        with FakeTensorMode() as mode:
            args = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in bad.args)
            with pytest.raises(bad.error, match=bad.match):
                getattr(npu_chain, spec.name)(*args)


def test_padding_rows_never_leak(refs):
    """inf/NaN in rows no group owns (psum gaps, -1 ids, rows beyond masked_m) stay out of every output."""
    a, b = torch.randn(12, 16), torch.randn(3, 5, 16)
    psum = torch.tensor([3, 7, 10], dtype=torch.int32)  # alignment 4: rows 3, 10, 11 are padding
    ids = torch.tensor([2, -1, 0, 0, 1, -1, 2, 1, 0, -1, 1, 2], dtype=torch.int32)  # unsorted ids
    for layout, psum_ in ((psum, True), (ids, False)):
        pad = torch.zeros(12, dtype=torch.bool)
        if psum_:
            pad[[3, 10, 11]] = True
        else:
            pad = ids < 0
        x = a.clone()
        x[pad] = float("inf")
        x[pad.nonzero()[0]] = float("nan")
        out = npu_chain.m_grouped_bf16_gemm(x, b, layout, psum_, 4, None)
        ref = torch.ops.ascend_moe.m_grouped_bf16_gemm(a, b, layout, psum_, 4, None)
        assert torch.isfinite(out).all() and (out[pad] == 0).all()
        assert calc_diff(out, ref) < THRESHOLDS[torch.float32]
        x2, y2 = x[:, :4].clone(), a[:, :6].clone()
        y2[pad] = float("inf")
        out = npu_chain.k_grouped_bf16_gemm(x2, y2, layout, 3, psum_, 4, None, None)
        ref = torch.ops.ascend_moe.k_grouped_bf16_gemm(a[:, :4], a[:, :6], layout, 3, psum_, 4, None, None)
        assert torch.isfinite(out).all() and calc_diff(out, ref) < THRESHOLDS[torch.float32]
    a3 = torch.randn(3, 4, 16)
    masked_m = torch.tensor([4, 0, 2], dtype=torch.int32)
    x3 = a3.clone()
    x3[1] = float("nan")
    x3[2, 2:] = float("inf")
    out = npu_chain.m_grouped_bf16_gemm_masked(x3, b, masked_m, None)
    ref = torch.ops.ascend_moe.m_grouped_bf16_gemm_masked(a3, b, masked_m, None)
    assert torch.isfinite(out).all() and calc_diff(out, ref) < THRESHOLDS[torch.float32]


def test_reference_group_list_forms(refs):
    """Our reference of npu_grouped_matmul itself: counts and cumsum agree, the docs' constraints raise."""
    x, w = torch.randn(7, 8), torch.randn(3, 8, 4)
    gmm = torch.ops.npu.npu_grouped_matmul
    cum = torch.tensor([2, 2, 7])
    (y0,) = gmm([x], [w], group_list=cum, split_item=3, group_type=0, group_list_type=0)
    (y1,) = gmm([x], [w], group_list=torch.tensor([2, 0, 5]), split_item=3, group_type=0, group_list_type=1)
    assert torch.equal(y0, y1) and torch.allclose(y0[2:], x[2:] @ w[2])
    (yb,) = gmm([x], [w], group_list=cum, split_item=3, group_type=0, output_dtype=torch.bfloat16)
    assert yb.dtype == torch.bfloat16
    with pytest.raises(RuntimeError, match="must end at M=7"):
        gmm([x], [w], group_list=torch.tensor([2, 2, 6]), split_item=3, group_type=0)
    (yk,) = gmm([x.T], [torch.randn(7, 4)], group_list=cum, split_item=3, group_type=2)
    assert yk.shape == (3, 8, 4) and (yk[1] == 0).all()


# ---- FP8 through MX (Ascend 950) ----

FP8_THRESHOLD = 1e-3  # DeepGEMM's FP8 x FP8 calc_diff threshold


@pytest.fixture
def ascend950(refs, monkeypatch):
    monkeypatch.setattr(adapters, "soc_version", lambda: 260)


@pytest.fixture
def mx_calls(monkeypatch):
    """The MX calls the adapters made, with their arguments checked against torchao-npu's layout."""
    calls = []
    real = adapters._gmm

    def checking(x, weight, group_list, group_type, output_dtype=None, **mx):
        assert mx and group_type == 0 and x.dtype == weight.dtype == torch.float8_e4m3fn
        assert x.is_contiguous() and weight.is_contiguous() and weight.dim() == 3  # row-major [G, K, N]
        (sw,), (sx,) = mx["scale"], mx["per_token_scale"]
        pairs = (x.shape[1] // 32 + 1) // 2
        assert sx.dtype == sw.dtype == torch.uint8
        assert sx.shape == (x.shape[0], pairs, 2) and sw.shape == (weight.shape[0], pairs, weight.shape[2], 2)
        assert mx["scale_dtype"] == mx["per_token_scale_dtype"] == 293
        calls.append(output_dtype)
        return real(x, weight, group_list, group_type, output_dtype, **mx)

    monkeypatch.setattr(adapters, "_gmm", checking)
    return calls


def _fp8(x, block, e8m0=False):
    """``x`` quantized per ``block`` with UE8M0 (power-of-two) scales: FP32 or ``float8_e8m0fnu``."""
    data, sf = torch.ops.ascend_moe.quantize_fp8(x.flatten(0, -2) if x.dim() > 2 else x, block, True, False)
    if x.dim() > 2:
        data, sf = data.view(x.shape), sf.view(*x.shape[:-2], -1, sf.shape[-1])
    return data, sf.to(torch.float8_e8m0fnu) if e8m0 else sf


def _weights(g, n, k, block, gen, e8m0=False):
    b = torch.randn(g, n, k, generator=gen)
    parts = [_fp8(b[i], block, e8m0) for i in range(g)]
    return torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts])


def _mx_samples():
    """UE8M0 samples the MX form takes: psum (aligned) and id layouts, the 128 x 128 and 1 x 128 B recipes, 1 x 32
    blocks, K not a multiple of 128, FP32 and E8M0 scale tensors, BF16 and FP32 outputs; masked batches."""
    gen = torch.Generator().manual_seed(21)
    out = []
    for m, g, n, k, ra, rb, e8m0, psum, dtype in [
        (24, 3, 40, 256, [1, 128], [128, 128], False, True, torch.bfloat16),
        (20, 4, 16, 96, [1, 32], [1, 32], True, False, torch.float32),
        (17, 2, 48, 160, [1, 32], [32, 32], False, True, torch.float32),
        (9, 3, 8, 128, [1, 128], [1, 128], True, True, torch.bfloat16),
    ]:
        a, sfa = _fp8(torch.randn(m, k, generator=gen), ra, e8m0)
        b, sfb = _weights(g, n, k, rb, gen, e8m0)
        if psum:  # group i: [align(end[i-1], 4), end[i]), the last one ending at m
            align, ends, start = 4, [], 0
            for i in range(g):
                cap = m - m % align  # a group's aligned end must leave the next one a valid start
                end = m if i == g - 1 else min(cap, start + int(torch.randint(0, 6, (1,), generator=gen)))
                ends.append(end)
                start = -(-end // align) * align
            layout = torch.tensor(ends, dtype=torch.int32)
        else:
            layout, align = torch.randint(-1, g, (m,), generator=gen, dtype=torch.int32), 1
        out.append(("m_grouped_fp8_gemm", (a, sfa, b, sfb, layout, psum, align, ra, rb, dtype)))
    for groups, m_max, n, k, ra, rb, e8m0 in [
        (3, 8, 24, 128, [1, 128], [128, 128], True),
        (2, 5, 16, 64, [1, 32], [1, 32], False),
    ]:
        a, sfa = _fp8(torch.randn(groups, m_max, k, generator=gen), ra, e8m0)
        b, sfb = _weights(groups, n, k, rb, gen, e8m0)
        masked = torch.tensor([m_max, 0, 3][:groups], dtype=torch.int32)
        out.append(("m_grouped_fp8_gemm_masked", (a, sfa, b, sfb, masked, ra, rb, torch.bfloat16)))
    return out


def test_mx_scale_layouts_are_torchao_npus():
    """Pairs of consecutive 32-wide K blocks, the pair last: per token [M, ceil(B/2), 2], weights
    [G, ceil(B/2), N, 2] (what npu_dynamic_mx_quant / its dual-axis form give torchao-npu's grouped GEMM)."""
    codes = torch.arange(2 * 5, dtype=torch.uint8).view(2, 5)  # 5 blocks: the last pair padded with 1.0 (127)
    pairs = adapters.mx_pairs(codes)
    assert pairs.shape == (2, 3, 2) and pairs[1, 1].tolist() == [7, 8] and pairs[0, 2].tolist() == [4, 127]
    gen = torch.Generator().manual_seed(3)
    a, sfa = _fp8(torch.randn(4, 128, generator=gen), [1, 32])
    b, sfb = _weights(2, 3, 128, [1, 32], gen)
    x, w, mx = adapters._mx_args(a, sfa, b, sfb, [1, 32], [1, 32], torch.ones(4, dtype=torch.bool))
    (sw,), (sx,) = mx["scale"], mx["per_token_scale"]
    code = lambda v: int(v.view(torch.int32) >> 23)  # noqa: E731
    for g, p, nn, i in [(0, 0, 0, 0), (1, 1, 2, 1), (0, 1, 1, 0)]:
        assert int(sw[g, p, nn, i]) == code(sfb[g, nn, 2 * p + i])
    assert (
        int(sx[3, 1, 1]) == code(sfa[3, 3])
        and torch.equal(w.view(torch.uint8), b.transpose(1, 2).view(torch.uint8))
        and x is a
    )


def test_mx_values(ascend950, mx_calls):
    """Every MX sample reaches npu_grouped_matmul's MX form (our CPU reading of it) and is within the FP8
    threshold of the fp64 reference and of our C++ kernel; rows no group owns are zeros; dtype/strides ours."""
    specs = {s.name: s for s in MX_ADAPTED}
    for name, args in _mx_samples():
        before = len(mx_calls)
        with mock.patch.object(adapters, "_mx_args", wraps=adapters._mx_args) as operands:
            out = getattr(npu_chain, name)(*args)
        assert len(mx_calls) == before + 1, name
        assert operands.call_count == 1, f"{name}: the MX operands (scale checks, copies) made more than once"
        ours, ref = specs[name].op(*args), with_defaults(name, specs[name].reference)(*args)
        assert (out.shape, out.dtype, out.stride()) == (ours.shape, ours.dtype, ours.stride()), name
        assert (out[ref == 0] == 0).all(), f"{name}: rows no group owns are not zeros"
        assert calc_diff(out, ref) < FP8_THRESHOLD and calc_diff(out, ours) < 1e-6, name
    # the spec's own samples: those with power-of-two scales take MX, the others the portable kernel
    for spec in MX_ADAPTED:
        for dtype in spec.dtypes:
            for s in spec.sample_inputs("cpu", dtype):
                out = getattr(npu_chain, spec.name)(*s.args)
                ref = with_defaults(spec.name, spec.reference)(*s.args)
                assert out.numel() == 0 or calc_diff(out, ref) < FP8_THRESHOLD, (spec.name, s.name)


def test_mx_meta_matches_our_fake(ascend950):
    """The MX call under FakeTensorMode, through torch_npu's own Meta kernel (scale dtypes, output dtype): the
    output has our op's fake's shape and dtype."""
    for name, args in _mx_samples():
        if name != "m_grouped_fp8_gemm":
            continue
        a, sfa, b, sfb, layout, psum, align, ra, rb, dtype = args
        x, w, mx = adapters._mx_args(a, sfa, b, sfb, ra, rb, torch.ones(a.shape[0], dtype=torch.bool))
        with FakeTensorMode() as mode:
            fake = lambda t: mode.from_tensor(t)  # noqa: E731
            mx_f = {k: [fake(v[0])] if isinstance(v, list) else v for k, v in mx.items()}
            cum = fake(torch.tensor([a.shape[0]] * b.shape[0]))
            y = torch.ops.npu.npu_grouped_matmul.default(
                [fake(x)],
                [fake(w)],
                group_list=cum,
                split_item=3,
                group_type=0,
                group_list_type=0,
                output_dtype=dtype,
                **mx_f,
            )[0]
            ours = torch.ops.ascend_moe.m_grouped_fp8_gemm(
                *(fake(t) if isinstance(t, torch.Tensor) else t for t in args)
            )
        assert (y.shape, y.dtype) == (ours.shape, ours.dtype)


@pytest.mark.parametrize(
    "case", ["before Ascend 950", "FP32 scales", "a zero scale", "a NaN E8M0 scale", "FP4 B", "K not 32s", "capturing"]
)
def test_mx_cases_that_stay_portable(ascend950, monkeypatch, mx_calls, case):
    from tests.capture_emulation import capturing_everywhere
    from torch_ascend_moe.backends.portable import grouped as portable

    gen = torch.Generator().manual_seed(8)
    m, g, n, k = 12, 2, 16, 128
    a, sfa = _fp8(torch.randn(m, k, generator=gen), [1, 128])
    b, sfb = _weights(g, n, k, [128, 128], gen)
    ra, rb = [1, 128], [128, 128]
    if case == "before Ascend 950":
        monkeypatch.setattr(adapters, "soc_version", lambda: 250)
    elif case == "FP32 scales":
        sfa = sfa * 1.5
    elif case == "a zero scale":
        sfb = sfb.clone()
        sfb[1, 0, 0] = 0
    elif case == "a NaN E8M0 scale":
        sfa = sfa.to(torch.float8_e8m0fnu).clone()
        sfa.view(torch.uint8)[2, 0] = 255
    elif case == "FP4 B":
        data, sf = torch.ops.ascend_moe.quantize_fp4(torch.randn(g * n, k, generator=gen), [1, 32], True, False)
        b, sfb, rb = data.view(g, n, k // 2), sf.view(g, n, -1), [1, 32]
    elif case == "K not 32s":
        k, ra, rb = 80, [1, 16], [16, 16]
        a, sfa = _fp8(torch.randn(m, k, generator=gen), ra)
        b, sfb = _weights(g, n, k, rb, gen)
    args = (a, sfa, b, sfb, torch.tensor([5, m], dtype=torch.int32), True, 1, ra, rb, torch.bfloat16)
    if case == "capturing":
        with capturing_everywhere():
            out = npu_chain.m_grouped_fp8_gemm(*args)
    else:
        out = npu_chain.m_grouped_fp8_gemm(*args)
    assert not mx_calls, case
    torch.testing.assert_close(out, portable.m_grouped_fp8_gemm(*args), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("spec", MX_ADAPTED, ids=str)
def test_mx_bad_inputs_raise_our_errors(spec, ascend950):
    for bad in spec.bad_inputs("cpu"):
        ours = _error(lambda bad=bad: spec.op(*bad.args))
        theirs = _error(lambda bad=bad: getattr(npu_chain, spec.name)(*bad.args))
        assert isinstance(ours, bad.error), (bad.name, ours)
        assert type(theirs) is type(ours) and str(theirs) == str(ours), (bad.name, theirs, ours)


def test_mx_no_host_read_while_capturing(ascend950, mx_calls):
    """While a graph is captured: E8M0 scale tensors take MX with no host read, equal to eager; FP32 scales (whose
    power-of-two check reads the host) go to the portable kernel."""
    from tests.capture_emulation import capturing_everywhere
    from tests.npu.test_capture import no_host_reads

    taken = 0
    for name, args in _mx_samples():
        eager = getattr(npu_chain, name)(*args)
        calls = len(mx_calls)
        if args[1].dtype != torch.float8_e8m0fnu:
            continue
        with capturing_everywhere(), no_host_reads():
            captured = getattr(npu_chain, name)(*args)
        assert len(mx_calls) == calls + 1 and torch.equal(captured, eager), name
        taken += 1
    assert taken >= 2


@pytest.mark.parametrize("name", sorted(STEPS))
def test_steps_reach_the_mx_form(name, ascend950, mx_calls, monkeypatch):
    """``m_grouped_fp8_linear`` / ``m_grouped_fp8_quant_gemm`` on Ascend: their portable kernels' steps on the NPU
    chains (CPU tensors through ``chain.on_cpu("npu")``, as NPU tensors would run): UE8M0 casts (with power-of-
    two expert scales) reach npu_grouped_matmul's MX form in one call (``m_grouped_fp8_linear``: every expert's
    weight cast at once) within the FP8 threshold of the portable kernel and of fp64, rows no expert owns zero;
    FP32 scales stay on the portable GEMM, bit for bit the portable kernel; layout errors under the op's name."""
    from tests.npu import quant_routing_refs
    from torch_ascend_moe.backends import chain
    from torch_ascend_moe.backends.npu import quant as npu_quant

    quant_routing_refs.register()
    monkeypatch.setattr(npu_quant, "soc_version", lambda: 260)
    spec = next(s for s in SPECS if s.name == name)
    op = getattr(torch.ops.ascend_moe, name)
    reached = 0
    for dtype in spec.dtypes:
        for s in spec.sample_inputs("cpu", dtype):
            before = len(mx_calls)
            with chain.on_cpu("npu"):
                out = op(*s.args)
            with chain.on_cpu("npu"), chain.disabled("torch_npu"):  # every step its portable kernel
                ours = op(*s.args)
            where = f"{name}[{s.name}, {dtype}]"
            assert (out.shape, out.dtype) == (ours.shape, ours.dtype), where
            if len(mx_calls) > before:
                assert len(mx_calls) == before + 1, where
                reached += 1
                ref = with_defaults(spec.name, spec.reference)(*s.args)
                assert (out[ref == 0] == 0).all(), f"{where}: rows no group owns are not zeros"
                assert calc_diff(out, ref) < FP8_THRESHOLD and calc_diff(out, ours) < 1e-6, where
            else:
                assert torch.equal(out, ours), f"{where}: not bitwise the portable kernel's"
    assert reached, "no sample reached the MX form"
    for bad in spec.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match), chain.on_cpu("npu"):
            op(*bad.args)
