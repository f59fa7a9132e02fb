"""The mqa_logits family's CUDA kernel (backends/cuda/_mqa.py behind ``mqa_logits``) on CPU tensors in Triton's
interpreter (tests/conftest.py sets ``TRITON_INTERPRET=1`` without a GPU): values against the specs' fp64
references and the C++ kernel, the -inf mask exact, NaN placement, which samples take the kernel, no host read
under an emulated capture, the bad-input campaign, opcheck and ``torch.compile`` through an opaque op. On a GPU the
same tests run the compiled kernel (tools/device_check.sh)."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

pytest.importorskip("triton")

from tests.capture_emulation import capturing_everywhere  # noqa: E402
from tests.chains import chosen, labels  # noqa: E402
from tests.chains import cuda_chain as kernels  # noqa: E402
from tests.cuda.opaque import check_opaque  # noqa: E402
from tests.mqa_logits import specs as T  # noqa: E402
from tests.npu.test_capture import no_host_reads  # noqa: E402
from torch_ascend_moe._registry import with_defaults  # noqa: E402
from torch_ascend_moe.backends.cuda import _mqa, _triton  # noqa: E402
from torch_ascend_moe.testing import calc_diff, campaign  # noqa: E402
from torch_ascend_moe.testing.harness import THRESHOLDS  # noqa: E402

pytestmark = pytest.mark.skipif(
    not _triton.INTERPRETED, reason="Triton's interpreter is off in this process (a GPU compiles the kernels)"
)
SPEC = next(s for s in T.SPECS if s.name == "mqa_logits")


def _samples():
    return [
        (dtype, s)
        for dtype in SPEC.dtypes
        for small in (False, True)
        for s in SPEC.sample_inputs("cpu", dtype, small=small)
    ]


def _takes(s) -> bool:
    q, k = s.args[0], s.args[2]
    return q.dtype != torch.float64 and q.shape[0] > 0 and k.shape[0] > 0


def _masks_and_diff(out, ref):
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite), "-inf mask differs"
    assert torch.equal(out[~finite], ref[~finite].to(out)), "masked entries are not exactly -inf"
    return calc_diff(out[finite], ref[finite]) if finite.any() else 0.0


def test_registered():
    assert labels("mqa_logits", "cuda") == ["deep_gemm.fp8_fp4_mqa_logits", "triton: _mqa", "portable"]


def _check_values(spec, launcher: str, samples, takes):
    """Each sample through the CUDA kernel: the Triton path taken exactly where ``takes`` says, the op's shape,
    dtype and strides, the -inf mask exact, within the fp64 reference's threshold, and within a few ulps of the C++
    kernel (the same FP32 terms summed in another order: over D in the dot, over heads in a tree; one rounding)."""
    reference = with_defaults(spec.name, spec.reference)
    taken = 0
    for dtype, s in samples:
        where = f"{spec.name}[{s.name}, {dtype}]"
        with mock.patch.object(_mqa, launcher, wraps=getattr(_mqa, launcher)) as launch:
            out = getattr(kernels, spec.name)(*s.args)
        assert launch.called == takes(s), f"{where}: Triton path taken = {launch.called}"
        taken += launch.called
        ours, ref = spec.op(*s.args), reference(*s.args)
        assert (out.shape, out.dtype, out.stride()) == (ours.shape, ours.dtype, ours.stride()), where
        if out.numel():
            assert _masks_and_diff(out, ref) < THRESHOLDS[out.dtype], where
            finite = torch.isfinite(ours)
            ulps = 1 if out.dtype == torch.bfloat16 else 64
            tol = ulps * torch.finfo(out.dtype).eps * max(ours[finite].abs().max().item(), 1e-30)
            assert (out[finite].double() - ours[finite].double()).abs().max().item() <= tol, where
    assert taken


def test_values_vs_fp64_and_the_cpu_kernel():
    _check_values(SPEC, "mqa_logits", _samples(), _takes)


@pytest.mark.parametrize("where", ["q", "k"])
def test_nan_lands_where_the_cpu_kernel_puts_it(where):
    """A NaN in a query (or key) row: NaN exactly in the logits the C++ kernel has NaN (the ReLU keeps it)."""
    g = torch.Generator().manual_seed(1)
    q, k, w = torch.randn(12, 4, 32, generator=g), torch.randn(70, 32, generator=g), torch.rand(12, 4, generator=g)
    ks, ke = T.random_ranges(12, 70, g)
    (q if where == "q" else k)[3, 0] = float("nan")
    out = kernels.mqa_logits(q, None, k, None, w, ks, ke, 0, None)
    ours = torch.ops.ascend_moe.mqa_logits(q, None, k, None, w, ks, ke)
    assert out.isnan().any() and torch.equal(out.isnan(), ours.isnan())
    keep = ~ours.isnan()
    assert torch.equal(out[keep].isinf(), ours[keep].isinf())


def test_no_host_read_while_capturing():
    for _, s in _samples():
        if not _takes(s):
            continue
        eager = kernels.mqa_logits(*s.args)
        with capturing_everywhere(), no_host_reads():
            captured = kernels.mqa_logits(*s.args)
        assert torch.equal(eager, captured), s.name


def test_bad_inputs_raise_our_errors():
    for bad in SPEC.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            kernels.mqa_logits(*bad.args)


def test_hostile_inputs_agree_with_the_cpu_kernel():
    samples = SPEC.sample_inputs("cpu", torch.float32, small=True)[:2]
    problems, count = campaign.kernel_problems(SPEC, kernels.mqa_logits, samples)
    assert count and not problems, "\n".join(problems[:5])


def test_opcheck_and_compile_through_an_opaque_op():
    samples = [s for _, s in _samples() if _takes(s)]
    check_opaque("mqa_logits", kernels.mqa_logits, [samples[0], samples[-1]])


FUSED = next(s for s in T.SPECS if s.name == "mqa_logits_topk")


def test_fused_top_k_is_the_composition_on_cuda():
    """``mqa_logits_topk``'s CUDA kernel: bitwise ``mqa_topk`` of this kernel's logits (the portable selection on
    the Triton logits, block by block), within the fp64 reference's thresholds."""
    from torch_ascend_moe.backends.portable import mqa_logits as portable

    reference = with_defaults(FUSED.name, FUSED.reference)
    taken = 0
    for dtype in FUSED.dtypes:
        for s in FUSED.sample_inputs("cpu", dtype):
            with mock.patch.object(_mqa, "mqa_logits", wraps=_mqa.mqa_logits) as launch:
                values, indices = kernels.mqa_logits_topk(*s.args)
            taken += launch.called
            q, q_sf, k, k_sf, w, ks, ke, topk, logits_dtype = s.args
            logits = kernels.mqa_logits(q, q_sf, k, k_sf, w, ks, ke, 0, logits_dtype)
            want = portable.mqa_topk(logits, ks, ke, topk, False)
            assert torch.equal(values, want[0]) and torch.equal(indices, want[1]), s.name
            ref_v, ref_i = reference(*s.args)
            assert _masks_and_diff(values, ref_v) < THRESHOLDS[values.dtype], s.name
    assert taken


PAGED = next(s for s in T.SPECS if s.name == "paged_mqa_logits")


def _paged_samples():
    return [(d, s) for d in PAGED.dtypes for small in (False, True) for s in PAGED.sample_inputs("cpu", d, small=small)]


def _paged_takes(s) -> bool:
    return chosen("paged_mqa_logits", "cuda", *s.args) == "triton: _mqa (paged)"


def test_paged_values_vs_fp64_and_the_cpu_kernel():
    """Pages read through the block table straight from the cache bytes (DeepGEMM's and the Ascend layout, FP8 and
    FP4, FP32 and UE8M0 scales, varlen rows, next_n > 1)."""
    _check_values(PAGED, "paged_mqa_logits", _paged_samples(), _paged_takes)


def test_paged_no_host_read_while_capturing():
    for _, s in _paged_samples():
        if not _paged_takes(s):
            continue
        eager = kernels.paged_mqa_logits(*s.args)
        with capturing_everywhere(), no_host_reads():
            captured = kernels.paged_mqa_logits(*s.args)
        assert torch.equal(eager, captured), s.name


def test_paged_bad_inputs_raise_our_errors():
    for bad in PAGED.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            kernels.paged_mqa_logits(*bad.args)


def test_paged_hostile_inputs_agree_with_the_cpu_kernel():
    """The campaign's mutations (a block id pointing at another page among them). The samples' unused pages hold
    random bytes (kernels must not read them); here they are zeroed, since values near FP32's limit overflow in
    sums whose order decides NaN or inf, in every kernel."""
    import dataclasses

    samples = []
    for _, s in _paged_samples():
        if not _paged_takes(s):
            continue
        cache, table = s.args[2].clone(), s.args[5]
        used = torch.zeros(cache.shape[0], dtype=torch.bool)
        used[table[table >= 0].long()] = True
        cache[~used] = 0
        samples.append(dataclasses.replace(s, args=(*s.args[:2], cache, *s.args[3:])))
    problems, count = campaign.kernel_problems(PAGED, kernels.paged_mqa_logits, samples[:1])
    assert count and not problems, "\n".join(problems[:5])


def test_paged_opcheck_and_compile_through_an_opaque_op():
    samples = [s for _, s in _paged_samples() if _paged_takes(s)]
    check_opaque("paged_mqa_logits", kernels.paged_mqa_logits, samples[:1])
