"""The gemm family's CUDA kernels (backends/cuda/gemm.py) on CPU tensors: cuBLAS's ``bmm(out_dtype=float32)``
has a Meta kernel in torch (its shape/dtype rules run under FakeTensorMode against our fakes) but no CPU kernel,
so for values it is emulated by the exact computation it stands for (BF16/FP16 products, FP32 sums): which calls
take it, and values against the specs' fp64 references. On a GPU, tools/device_check.sh runs the real one."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.chains import cuda_chain as kernels
from tests.chains import labels
from tests.gemm.specs import SPECS
from torch_ascend_moe._registry import with_defaults
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.harness import THRESHOLDS

ADAPTED = [s for s in SPECS if any(label.startswith("aten: cuBLAS") for label in labels(s.name, "cuda"))]
_BMM = torch.bmm


def _bmm_with_out_dtype(a, b, *, out_dtype=None):
    """``bmm(out_dtype=float32)`` as cuBLAS computes it: exact BF16/FP16 products, FP32 sums."""
    calls.append(out_dtype)
    if out_dtype is None:
        return _BMM(a, b)
    assert out_dtype == torch.float32 and a.dtype in (torch.bfloat16, torch.float16)
    return _BMM(a.float(), b.float())


calls: list = []


def _out_dtype_variants(spec):
    """Every sample, and each float sample again with an FP32 result (out_dtype, when it has no c)."""
    names = [a.name for a in spec.op._schema.arguments]
    index = names.index("out_dtype")
    out = []
    for dtype in (*spec.dtypes, torch.float16):
        for s in spec.sample_inputs("cpu", dtype):
            out.append((dtype, s))
            c = s.args[names.index("c")]
            if c is None and dtype != torch.float32:
                args = list(s.args)
                args[index] = torch.float32
                out.append((dtype, dataclasses.replace(s, args=tuple(args), name=f"{s.name} out=fp32")))
    return out


def test_registered():
    assert {s.name for s in ADAPTED} == {"bf16_gemm", "bf16_bmm", "bf16_einsum"}


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_fp32_results_take_the_fp32_accumulator(spec):
    reference = with_defaults(spec.name, spec.reference)
    taken = 0
    for dtype, s in _out_dtype_variants(spec):
        calls.clear()
        with mock.patch.object(torch, "bmm", _bmm_with_out_dtype):
            out = getattr(kernels, spec.name)(*s.args)
        ours, ref = spec.op(*s.args), reference(*s.args)
        where = f"{spec.name}[{s.name}, {dtype}]"
        fp32_result = ours.dtype == torch.float32 and dtype in (torch.bfloat16, torch.float16)
        assert (torch.float32 in calls) == fp32_result, f"{where}: {calls}"
        taken += torch.float32 in calls
        assert (out.shape, out.dtype, out.stride()) == (ours.shape, ours.dtype, ours.stride()), where
        if out.numel():
            assert calc_diff(out, ref) < THRESHOLDS[dtype], where
            assert calc_diff(out, ours) < THRESHOLDS[out.dtype], where
    assert taken, spec.name


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_fake_matches_our_fake(spec):
    """Under FakeTensorMode the kernel runs torch's own Meta of ``bmm.dtype``; its outputs are our op's fake."""
    for _, s in _out_dtype_variants(spec):
        with FakeTensorMode() as mode:
            args = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in s.args)
            out, fake = getattr(kernels, spec.name)(*args), spec.op(*args)
        assert (out.shape, out.dtype, out.stride()) == (fake.shape, fake.dtype, fake.stride()), (spec.name, s.name)


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_bad_inputs_raise_our_errors(spec):
    for bad in spec.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            getattr(kernels, spec.name)(*bad.args)
