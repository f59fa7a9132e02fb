"""The grouped family's CUDA kernels (backends/cuda/grouped.py) on CPU tensors: ``torch._grouped_mm`` has a CPU
kernel and a Meta kernel in torch itself, so the layout mapping around it (device-side, no host sync) is checked
here for values against the specs' fp64 references, for shapes/dtypes/strides against our fakes under
FakeTensorMode (torch's own _grouped_mm checks), for no host read while a graph is captured, and for which
samples take the fused path. Its CUDA kernel itself (CUTLASS) runs on the lent GPU only (tools/device_check.sh)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from tests.capture_emulation import capturing_everywhere
from tests.chains import cuda_chain as kernels
from tests.chains import has
from tests.grouped.specs import SPECS
from tests.npu.test_capture import no_host_reads
from torch_ascend_moe._registry import with_defaults
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.harness import THRESHOLDS

ADAPTED = [s for s in SPECS if has(s.name, "cuda", "aten: torch._grouped_mm")]


def _samples(spec):
    return [
        (dtype, s)
        for dtype in spec.dtypes
        for small in (False, True)
        for s in spec.sample_inputs("cpu", dtype, small=small)
    ]


def _fused(spec, dtype, s) -> bool:
    """Whether the sample should take torch._grouped_mm: BF16, 16-byte aligned K and N, non-empty, no c."""
    a, b = s.args[0], s.args[1]
    if dtype != torch.bfloat16 or a.numel() == 0 or b.shape[0] == 0:
        return False
    if spec.name == "k_grouped_bf16_gemm":
        return s.args[6] is None and a.shape[1] % 8 == 0 and b.shape[1] % 8 == 0
    return b.shape[-1] % 8 == 0 and b.shape[1] % 8 == 0


def test_registered():
    assert {s.name for s in ADAPTED} == {"m_grouped_bf16_gemm", "m_grouped_bf16_gemm_masked", "k_grouped_bf16_gemm"}


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_values_and_mapping(spec):
    reference = with_defaults(spec.name, spec.reference)
    fused = 0
    for dtype, s in _samples(spec):
        where = f"{spec.name}[{s.name}, {dtype}]"
        with mock.patch.object(torch, "_grouped_mm", wraps=torch._grouped_mm) as gmm:
            out = getattr(kernels, spec.name)(*s.args)
        ours, ref = spec.op(*s.args), reference(*s.args)
        assert gmm.called == _fused(spec, dtype, s), f"{where}: fused path taken = {gmm.called}"
        fused += gmm.called
        assert out.shape == ours.shape and out.dtype == ours.dtype, where
        assert out.stride() == ours.stride(), f"{where}: strides {out.stride()} != {ours.stride()}"
        assert torch.isfinite(out).all(), f"{where}: non-finite values (a padding row leaked)"
        assert (out[ref == 0] == 0).all(), f"{where}: rows no group owns are not zeros"
        if out.numel():
            assert calc_diff(out, ref) < THRESHOLDS[dtype], where
    assert fused, f"{spec.name}: no sample took torch._grouped_mm"


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_fake_matches_our_fake(spec):
    """Under FakeTensorMode the kernel runs torch's own Meta of _grouped_mm (dtype and 16-byte stride rules);
    its outputs are our op's fake."""
    for dtype, s in _samples(spec):
        if not _fused(spec, dtype, s):
            continue
        with FakeTensorMode() as mode:
            args = tuple(mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in s.args)
            out, fake = getattr(kernels, spec.name)(*args), spec.op(*args)
        assert (out.shape, out.dtype, out.stride()) == (fake.shape, fake.dtype, fake.stride()), spec.name


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_no_host_read_while_capturing(spec):
    """The fused path reads no tensor value on the host while a CUDA graph is captured (emulated here), and gives
    the eager result."""
    for dtype, s in _samples(spec):
        if not _fused(spec, dtype, s):
            continue
        eager = getattr(kernels, spec.name)(*s.args)
        with capturing_everywhere(), no_host_reads():
            captured = getattr(kernels, spec.name)(*s.args)
        assert torch.equal(eager, captured), spec.name


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_bad_inputs_raise_our_errors(spec):
    for bad in spec.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            getattr(kernels, spec.name)(*bad.args)


def test_operands_start_16_byte_aligned():
    """A view starting mid-storage (a slice) reaches _grouped_mm as an aligned copy: CUDA checks the pointer."""
    spec = next(s for s in ADAPTED if s.name == "m_grouped_bf16_gemm")
    s = spec.sample_inputs("cpu", torch.bfloat16)[0]
    a = s.args[0]
    a_view = torch.cat([a.new_zeros(1), a.flatten()])[1:].view(a.shape)  # one element into its storage
    assert (a_view.storage_offset() * 2) % 16
    seen = []
    real = torch._grouped_mm

    def check(x, w, *args, **kwargs):
        for t in (x, w):
            seen.append(t.storage_offset() * t.element_size() % 16)
        return real(x, w, *args, **kwargs)

    with mock.patch.object(torch, "_grouped_mm", check):
        out = kernels.m_grouped_bf16_gemm(a_view, *s.args[1:])
    assert seen and not any(seen)
    assert torch.equal(out, kernels.m_grouped_bf16_gemm(a, *s.args[1:]))


@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_hostile_inputs_agree_with_the_cpu_kernel(spec):
    """The bad-input campaign's mutations of BF16 samples the fused path takes (every other dtype, ranks, sizes,
    strides, int64 edges, NaN, out-of-range layout values): the CUDA kernel gives the C++ kernel's verdict, the
    same whole message, and its outputs where both accept."""

    from torch_ascend_moe.testing import campaign

    samples = spec.sample_inputs("cpu", torch.bfloat16)[:3]
    problems, count = campaign.kernel_problems(spec, getattr(kernels, spec.name), samples)
    assert count and not problems, "\n".join(problems[:5])


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (tools/device_check.sh)")


def _on(device, s):
    return tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in s.args)


@GPU
@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_cuda_values_and_dispatch(spec):
    """On a GPU the op itself reaches the CUDA kernel (torch._grouped_mm's CUTLASS path on sm90+): values vs the
    fp64 reference, and equal to the kernel run on CPU within the output dtype's threshold."""
    reference = with_defaults(spec.name, spec.reference)
    for dtype, s in _samples(spec):
        args = _on("cuda", s)
        out = spec.op(*args)
        ref = reference(*s.args)
        assert out.device.type == "cuda" and out.dtype == spec.op(*s.args).dtype
        if out.numel():
            assert calc_diff(out.cpu(), ref) < THRESHOLDS[dtype], f"{spec.name}[{s.name}, {dtype}]"


@GPU
@pytest.mark.parametrize("spec", ADAPTED, ids=str)
def test_cuda_graph_capture_and_replay(spec):
    """The fused path captures in a CUDA graph (no host sync) and its replay equals eager on new inputs."""
    for dtype, s in _samples(spec):
        if not _fused(spec, dtype, s):
            continue
        args = _on("cuda", s)
        static = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
        spec.op(*static)  # warm-up outside the capture (allocator, lazy inits)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = spec.op(*static)
        for a, b in zip(static, args):
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                a.copy_(torch.randn_like(b, dtype=torch.float32).to(b.dtype))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, spec.op(*static)), f"{spec.name}[{s.name}]"
