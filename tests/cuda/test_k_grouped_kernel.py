"""``k_grouped_fp8_gemm``'s CUDA kernel (backends/cuda/_k_grouped.py) on CPU tensors in Triton's interpreter: values
against the fp64 reference and the C++ kernel, which samples take it, non-finite scales landing where the
dequantize-then-multiply contract puts them, no host read under an emulated capture, bad inputs, the bad-input
campaign, and opcheck / ``torch.compile`` through an opaque op."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

pytest.importorskip("triton")

from tests.capture_emulation import capturing_everywhere  # noqa: E402
from tests.chains import chosen, labels  # noqa: E402
from tests.chains import cuda_chain as kernels  # noqa: E402
from tests.cuda.opaque import check_opaque  # noqa: E402
from tests.grouped.specs import SPECS  # noqa: E402
from tests.npu.test_capture import no_host_reads  # noqa: E402
from torch_ascend_moe._registry import with_defaults  # noqa: E402
from torch_ascend_moe.backends.cuda import _k_grouped, _triton  # noqa: E402
from torch_ascend_moe.backends.portable import grouped as portable  # noqa: E402
from torch_ascend_moe.testing import calc_diff, campaign  # noqa: E402
from torch_ascend_moe.testing.harness import THRESHOLDS  # noqa: E402

pytestmark = pytest.mark.skipif(
    not _triton.INTERPRETED, reason="Triton's interpreter is off in this process (a GPU compiles the kernels)"
)
SPEC = next(s for s in SPECS if s.name == "k_grouped_fp8_gemm")


def _samples():
    return [(d, s) for d in SPEC.dtypes for small in (False, True) for s in SPEC.sample_inputs("cpu", d, small=small)]


def _takes(s) -> bool:
    return chosen("k_grouped_fp8_gemm", "cuda", *s.args) == "triton: _k_grouped"


def test_registered():
    chain = labels("k_grouped_fp8_gemm", "cuda")
    assert chain == ["deep_gemm.k_grouped_fp8_gemm_tn_contiguous (psum)", "triton: _k_grouped", "portable"]


def test_values_vs_fp64_and_the_cpu_kernel():
    reference = with_defaults(SPEC.name, SPEC.reference)
    taken = 0
    for dtype, s in _samples():
        where = f"{SPEC.name}[{s.name}, {dtype}]"
        with mock.patch.object(_k_grouped, "k_grouped", wraps=_k_grouped.k_grouped) as launch:
            out = kernels.k_grouped_fp8_gemm(*s.args)
        assert launch.called == _takes(s), f"{where}: Triton path taken = {launch.called}"
        taken += launch.called
        ours, ref = SPEC.op(*s.args), reference(*s.args)
        assert (out.shape, out.dtype, out.stride()) == (ours.shape, ours.dtype, ours.stride()), where
        if out.numel():
            assert calc_diff(out, ref) < THRESHOLDS[dtype], where
            ulps = 1 if out.dtype == torch.bfloat16 else 16  # the same FP32 terms in another order, one rounding
            tol = ulps * torch.finfo(out.dtype).eps * max(ours.abs().max().item(), 1e-30)
            assert (out.double() - ours.double()).abs().max().item() <= tol, where
    assert taken


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0])
def test_special_scales_land_as_the_contract_puts_them(value):
    checked = 0
    for dtype, s in _samples():
        if not _takes(s) or dtype != torch.float32 or s.args[1].dtype != torch.float32:
            continue
        args = list(s.args)
        bad = args[1].clone()
        bad.view(-1)[:: max(1, bad.numel() // 3)] = value
        args[1] = bad
        out, contract = kernels.k_grouped_fp8_gemm(*args), portable.k_grouped_fp8_gemm(*args)
        assert torch.equal(out.isnan(), contract.isnan()), f"{s.name}: NaN placement"
        inf = out.isinf() | contract.isinf()
        assert torch.equal(out[inf], contract[inf]), f"{s.name}: infinities"
        finite = ~(out.isnan() | inf)
        if finite.any():
            scale = max(contract[finite].abs().max().item(), 1e-30)
            assert (out[finite] - contract[finite]).abs().max().item() <= 1e-5 * scale, s.name
        checked += 1
    assert checked


def test_no_host_read_while_capturing():
    for _, s in _samples():
        if not _takes(s):
            continue
        eager = kernels.k_grouped_fp8_gemm(*s.args)
        with capturing_everywhere(), no_host_reads():
            captured = kernels.k_grouped_fp8_gemm(*s.args)
        assert torch.equal(eager, captured), s.name


def test_bad_inputs_raise_our_errors():
    for bad in SPEC.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            kernels.k_grouped_fp8_gemm(*bad.args)


def test_hostile_inputs_agree_with_the_cpu_kernel():
    samples = SPEC.sample_inputs("cpu", torch.float32, small=True)[:2]
    problems, count = campaign.kernel_problems(SPEC, kernels.k_grouped_fp8_gemm, samples)
    assert count and not problems, "\n".join(problems[:5])


def test_opcheck_and_compile_through_an_opaque_op():
    samples = [s for d, s in _samples() if _takes(s) and d == torch.float32]
    check_opaque(SPEC.name, kernels.k_grouped_fp8_gemm, samples[:2])
