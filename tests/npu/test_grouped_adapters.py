"""The grouped family's Ascend adapters (backends/npu/grouped.py) against torch_npu's real schema and Meta kernel
(shapes, dtypes, strides under FakeTensorMode) and, through our CPU reference of npu_grouped_matmul
(tests/npu/grouped_refs.py), for values against the specs' fp64 references."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.grouped.specs import SPECS
from torch_ascend_moe._registry import NPU_KERNELS, _schema, with_defaults
from torch_ascend_moe.backends.npu import grouped as adapters
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.harness import THRESHOLDS

ADAPTED = [s for s in SPECS if hasattr(adapters, s.name)]
PORTABLE_ONLY = {"m_grouped_fp8_gemm", "m_grouped_fp8_gemm_masked", "m_grouped_fp8_linear", "k_grouped_fp8_gemm"}


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
    assert {s.name for s in SPECS} == {s.name for s in ADAPTED} | PORTABLE_ONLY
    for spec in ADAPTED:
        assert NPU_KERNELS[spec.name] == "npu_grouped_matmul"
    assert not PORTABLE_ONLY & NPU_KERNELS.keys()


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_meta_matches_our_fake(spec, npu_ops, gmm_calls):
    """Under FakeTensorMode the adapter runs torch_npu's own Meta kernel; its outputs match our op's fake."""
    cases = _cases(spec) + _out_dtype_variants(spec)
    for dtype, s in cases:
        with FakeTensorMode() as mode:
            args = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in s.args)
            ours = spec.op(*args)
            out = getattr(adapters, spec.name)(*args)
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
        out = getattr(adapters, spec.name)(*s.args)
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
        out = adapters.k_grouped_bf16_gemm(a, b, layout, 2, True, 4, None, None)
        ref = torch.ops.ascend_moe.k_grouped_bf16_gemm(a.contiguous(), b.contiguous(), layout, 2, True, 4)
        assert calc_diff(out, ref) < THRESHOLDS[torch.float32]
    x, w = torch.randn(16, 12).T, torch.randn(2, 8, 16)[:, ::2]  # x column-major; w sliced along N
    m_layout = torch.tensor([4, 12], dtype=torch.int32)
    out = adapters.m_grouped_bf16_gemm(x, w, m_layout, True, 1, None)
    ref = torch.ops.ascend_moe.m_grouped_bf16_gemm(x.contiguous(), w.contiguous(), m_layout, True, 1)
    assert calc_diff(out, ref) < THRESHOLDS[torch.float32]
    # A column-major accumulator: the output is still row-major (our op's fake), with and without rows.
    c = torch.randn(2, 6, 5).transpose(1, 2)
    for a in (torch.randn(20, 5), torch.randn(0, 5)):
        rows = a.shape[0]
        ends = torch.tensor([min(4, rows), rows], dtype=torch.int32)
        out = adapters.k_grouped_bf16_gemm(a, b[:rows], ends, 2, True, 4, c, None)
        ref = torch.ops.ascend_moe.k_grouped_bf16_gemm(a, b[:rows].contiguous(), ends, 2, True, 4, c)
        assert out.is_contiguous() and calc_diff(out, ref) < THRESHOLDS[torch.float32]
    assert gmm_calls == [2, 2, 0, 2]


def test_float64_runs_the_portable_kernel(refs, gmm_calls):
    for spec in ADAPTED:
        reference = with_defaults(spec.name, spec.reference)
        for s in spec.sample_inputs("cpu", torch.float64):
            out = getattr(adapters, spec.name)(*s.args)
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
            out = getattr(adapters, spec.name)(*s.args)
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
        theirs = _error(lambda bad=bad: getattr(adapters, spec.name)(*bad.args))
        assert isinstance(ours, bad.error), (bad.name, ours)
        assert type(theirs) is type(ours) and str(theirs) == str(ours), (bad.name, theirs, ours)
        if bad.data_dependent:
            continue
        with FakeTensorMode() as mode:
            args = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in bad.args)
            with pytest.raises(bad.error, match=bad.match):
                getattr(adapters, spec.name)(*args)


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
        out = adapters.m_grouped_bf16_gemm(x, b, layout, psum_, 4, None)
        ref = torch.ops.ascend_moe.m_grouped_bf16_gemm(a, b, layout, psum_, 4, None)
        assert torch.isfinite(out).all() and (out[pad] == 0).all()
        assert calc_diff(out, ref) < THRESHOLDS[torch.float32]
        x2, y2 = x[:, :4].clone(), a[:, :6].clone()
        y2[pad] = float("inf")
        out = adapters.k_grouped_bf16_gemm(x2, y2, layout, 3, psum_, 4, None, None)
        ref = torch.ops.ascend_moe.k_grouped_bf16_gemm(a[:, :4], a[:, :6], layout, 3, psum_, 4, None, None)
        assert torch.isfinite(out).all() and calc_diff(out, ref) < THRESHOLDS[torch.float32]
    a3 = torch.randn(3, 4, 16)
    masked_m = torch.tensor([4, 0, 2], dtype=torch.int32)
    x3 = a3.clone()
    x3[1] = float("nan")
    x3[2, 2:] = float("inf")
    out = adapters.m_grouped_bf16_gemm_masked(x3, b, masked_m, None)
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
