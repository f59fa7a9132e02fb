"""The hc_prenorm family's CUDA kernel (backends/cuda/_hc.py behind ``hc_prenorm_gemm``) on CPU tensors in Triton's
interpreter: values against the fp64 reference (DeepGEMM's thresholds) and within FP32 summation-order ulps of the C++
kernel, on the specs' samples and random shapes, strides and splits (empty splits included); NaN and inf where the
C++ kernel has them; which calls take the kernel, no host read under an emulated capture, bad inputs, the campaign,
opcheck/compile. On a GPU: the same on CUDA tensors (TF32 tensor cores), and CUDA-graph capture and replay."""

from __future__ import annotations

from unittest import mock

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

pytest.importorskip("triton")

from tests.capture_emulation import capturing_everywhere  # noqa: E402
from tests.chains import cuda_chain as kernels  # noqa: E402
from tests.chains import labels  # noqa: E402
from tests.cuda.opaque import check_opaque  # noqa: E402
from tests.cuda.test_grouped_kernels import GPU, _on  # noqa: E402
from tests.hc_prenorm.specs import SPECS, reference  # noqa: E402
from tests.npu.test_capture import no_host_reads  # noqa: E402
from torch_ascend_moe.backends.cuda import _hc, _triton  # noqa: E402
from torch_ascend_moe.testing import calc_diff, campaign  # noqa: E402
from torch_ascend_moe.testing.harness import THRESHOLDS  # noqa: E402

INTERPRETED = pytest.mark.skipif(
    not _triton.INTERPRETED, reason="Triton's interpreter is off in this process (a GPU compiles the kernels)"
)
SPEC = SPECS[0]


def _samples():
    return [(d, s) for d in SPEC.dtypes for small in (False, True) for s in SPEC.sample_inputs("cpu", d, small=small)]


def _takes(s) -> bool:
    a, b = s.args[0], s.args[1]
    return a.dtype != torch.float64 and a.shape[0] > 0 and b.shape[0] > 0


def _check(got, args, where, ulps=8):
    """Shape, dtype and strides of the op; NaN/inf where the C++ kernel has them; the rest within the fp64 threshold
    and within ``ulps`` FP32 ulps (of the output's scale, per split) of the C++ kernel."""
    ours, ref = torch.ops.ascend_moe.hc_prenorm_gemm(*args), reference(*args)
    for g, o, r in zip(got, ours, ref, strict=True):
        assert (g.shape, g.dtype, g.stride()) == (o.shape, o.dtype, o.stride()), where
        finite, inf = o.isfinite(), o.isinf()
        assert torch.equal(g.isnan(), o.isnan()) and torch.equal(g[inf], o[inf]), where
        if finite.any():
            assert calc_diff(g[finite], r[finite].to(g)) < THRESHOLDS[torch.float32], where
            tol = ulps * torch.finfo(torch.float32).eps * o[finite].abs().max().item()
            assert (g[finite] - o[finite]).abs().max().item() <= tol, where


def test_registered():
    assert labels("hc_prenorm_gemm", "cuda") == ["deep_gemm.tf32_hc_prenorm_gemm", "triton: _hc", "portable"]


@INTERPRETED
def test_spec_samples_vs_fp64_and_the_cpu_kernel():
    taken = 0
    for dtype, s in _samples():
        with mock.patch.object(_hc, "hc_prenorm_gemm", wraps=_hc.hc_prenorm_gemm) as launch:
            got = kernels.hc_prenorm_gemm(*s.args)
        assert launch.called == _takes(s), (s.name, dtype)
        taken += launch.called
        _check(got, s.args, f"{s.name} {dtype}")
    assert taken


@INTERPRETED
@settings(max_examples=25, deadline=None)  # the interpreter runs each program in Python: small tensors
@given(
    m=st.integers(1, 70),
    n=st.integers(1, 40),
    blocks=st.integers(1, 5),
    splits=st.sampled_from([None, 1, 2, 3, 7]),
    dtype=st.sampled_from([torch.bfloat16, torch.float32]),
    strided=st.booleans(),
    special=st.sampled_from([None, "nan", "inf", "-inf", "low-payload nan"]),
    in_b=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_random_calls(m, n, blocks, splits, dtype, strided, special, in_b, seed):
    g = torch.Generator().manual_seed(seed)
    k = 64 * blocks
    a = torch.randn(m, 2 * k if strided else k, generator=g).to(dtype)
    b = torch.randn(n, 2 * k if strided else k, generator=g) / k**0.5
    if strided:
        a, b = a[:, ::2], b[:, ::2]
    if special == "low-payload nan":  # 0x7F800001: rounding its mantissa alone would make it inf
        in_b = True
        b.view(torch.int32)[seed % n, seed % k] = 0x7F800001
    elif special is not None:
        (b if in_b else a)[seed % (n if in_b else m), seed % k] = float(special)
    _check(kernels.hc_prenorm_gemm(a, b, splits), (a, b, splits), f"M{m} N{n} K{k} splits={splits}")


@INTERPRETED
def test_no_host_read_while_capturing():
    for _, s in _samples():
        if _takes(s):
            eager = kernels.hc_prenorm_gemm(*s.args)
            with capturing_everywhere(), no_host_reads():
                captured = kernels.hc_prenorm_gemm(*s.args)
            assert all(torch.equal(x, y) for x, y in zip(eager, captured)), s.name


def test_bad_inputs_raise_our_errors():
    for bad in SPEC.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            kernels.hc_prenorm_gemm(*bad.args)


@INTERPRETED
def test_hostile_inputs_agree_with_the_cpu_kernel():
    problems, count = campaign.kernel_problems(
        SPEC, kernels.hc_prenorm_gemm, SPEC.sample_inputs("cpu", torch.bfloat16, small=True)[:2]
    )
    assert count and not problems, "\n".join(problems[:5])


@INTERPRETED
def test_opcheck_and_compile_through_an_opaque_op():
    samples = [s for _, s in _samples() if _takes(s)]
    check_opaque("hc_prenorm_gemm", kernels.hc_prenorm_gemm, [samples[0], samples[-1]])


@GPU
def test_cuda_values():
    for dtype, s in _samples():
        got = tuple(x.cpu() for x in SPEC.op(*_on("cuda", s)))
        # Tensor cores add an MMA's products with truncation, not FP32's nearest rounding: a bias that grows with
        # K (an H200, K = 1024: 22 ulps of the output's scale from the C++ kernel's sums).
        _check(got, s.args, f"{s.name} {dtype}", ulps=max(8, s.args[0].shape[1] // 16))


@GPU
def test_cuda_graph_capture_and_replay():
    for dtype, s in _samples():
        if not _takes(s) or dtype != torch.bfloat16:
            continue
        args = _on("cuda", s)
        SPEC.op(*args)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = SPEC.op(*args)
        args[0].copy_(torch.randn_like(args[0]))
        graph.replay()
        torch.cuda.synchronize()
        assert all(torch.equal(x, y) for x, y in zip(out, SPEC.op(*args))), s.name
