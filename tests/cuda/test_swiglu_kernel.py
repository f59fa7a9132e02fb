"""``m_grouped_bf16_gemm_swiglu``'s CUDA kernel (backends/cuda/_swiglu.py) on CPU tensors in Triton's interpreter:
values against the fp64 reference and the C++ kernel (to FP32 rounding: Triton's exp is not ATen's), which samples
take it, NaN/inf rows where the C++ kernel has them, the padding rows' prefill, no host read under an emulated capture,
bad inputs, the hostile-input campaign, and opcheck / ``torch.compile`` through an opaque op."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from tests.capture_emulation import capturing_everywhere  # noqa: E402
from tests.chains import chosen, labels  # noqa: E402
from tests.chains import cuda_chain as kernels  # noqa: E402
from tests.cuda.opaque import check_opaque  # noqa: E402
from tests.grouped.specs import SPECS  # noqa: E402
from tests.grouped.test_grouped_swiglu import _assert_close  # noqa: E402
from tests.npu.test_capture import no_host_reads  # noqa: E402
from torch_ascend_moe._registry import with_defaults  # noqa: E402
from torch_ascend_moe.backends.cuda import _swiglu, _triton  # noqa: E402
from torch_ascend_moe.testing import calc_diff, campaign  # noqa: E402
from torch_ascend_moe.testing.harness import THRESHOLDS  # noqa: E402

pytestmark = pytest.mark.skipif(
    not _triton.INTERPRETED, reason="Triton's interpreter is off in this process (a GPU compiles the kernels)"
)
SPEC = next(s for s in SPECS if s.name == "m_grouped_bf16_gemm_swiglu")


def _samples():
    return [(d, s) for d in SPEC.dtypes for small in (False, True) for s in SPEC.sample_inputs("cpu", d, small=small)]


def _takes(s) -> bool:
    return chosen("m_grouped_bf16_gemm_swiglu", "cuda", *s.args) == "triton: _swiglu"


def test_registered():
    assert labels("m_grouped_bf16_gemm_swiglu", "cuda") == ["triton: _swiglu", "portable"]


def test_values_vs_fp64_and_the_cpu_kernel(monkeypatch):
    reference = with_defaults(SPEC.name, SPEC.reference)
    launches = []
    monkeypatch.setattr(
        _swiglu, "swiglu_gemm", lambda *a, _f=_swiglu.swiglu_gemm, **k: launches.append(1) or _f(*a, **k)
    )
    taken = 0
    for dtype, s in _samples():
        where = f"{SPEC.name}[{s.name}, {dtype}]"
        before = len(launches)
        out, sf = kernels.m_grouped_bf16_gemm_swiglu(*s.args)
        assert (len(launches) > before) == _takes(s), f"{where}: Triton path taken = {len(launches) > before}"
        taken += _takes(s)
        ours, ours_sf = SPEC.op(*s.args)
        ref, _ = reference(*s.args)
        assert (out.shape, out.dtype, out.stride(), sf.shape) == (ours.shape, ours.dtype, ours.stride(), ours_sf.shape)
        gran = s.args[7]
        _assert_close(out, sf, ours, ours_sf, gran)
        if out.numel() and not gran:
            assert calc_diff(out, ref) < THRESHOLDS[dtype], where
    assert taken


@pytest.mark.parametrize("gran", [0, 32])
def test_nonfinite_rows_land_where_the_cpu_kernel_puts_them(gran):
    g = torch.Generator().manual_seed(5)
    layout = torch.tensor([3, 3, 20], dtype=torch.int32)
    a = torch.randn(24, 48, generator=g).bfloat16()
    a[1, 5], a[10, 0] = float("nan"), float("inf")
    b = torch.randn(3, 128, 48, generator=g).bfloat16()
    w = torch.rand(24, generator=g)
    w[22] = float("nan")  # a padding row's weight: its zero L1 output times NaN
    args = (a, b, layout, True, 1, w, 2.0, gran, False, None)
    out, sf = kernels.m_grouped_bf16_gemm_swiglu(*args)
    want, want_sf = SPEC.op(*args)
    _assert_close(out, sf, want, want_sf, gran)


def test_no_host_read_while_capturing():
    for _, s in _samples():
        if not _takes(s):
            continue
        eager = kernels.m_grouped_bf16_gemm_swiglu(*s.args)
        with capturing_everywhere(), no_host_reads():
            captured = kernels.m_grouped_bf16_gemm_swiglu(*s.args)
        for x, y in zip(eager, captured, strict=True):
            assert torch.equal(x.view(torch.uint8), y.view(torch.uint8)), s.name


def test_bad_inputs_raise_our_errors():
    for bad in SPEC.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            kernels.m_grouped_bf16_gemm_swiglu(*bad.args)


def test_hostile_inputs_agree_with_the_cpu_kernel():
    samples = SPEC.sample_inputs("cpu", torch.float32, small=True)[:2]
    problems, count = campaign.kernel_problems(SPEC, kernels.m_grouped_bf16_gemm_swiglu, samples)
    assert count and not problems, "\n".join(problems[:5])


def test_opcheck_and_compile_through_an_opaque_op():
    samples = [s for d, s in _samples() if _takes(s) and d == torch.float32]
    check_opaque(SPEC.name, kernels.m_grouped_bf16_gemm_swiglu, samples[:2])
