"""The quant family's CUDA kernels (backends/cuda/_quant.py behind ``quantize_fp8`` / ``quantize_fp4``) on CPU tensors
in Triton's interpreter: bit for bit the C++ kernel on the specs' samples and on random shapes, blocks and values
(subnormal, near the formats' limits, NaN, inf), and the E4M3 rounding itself against torch's conversion on every
BF16 value and random FP32 ones. Also: which calls take the kernel, bad inputs, the campaign, opcheck/compile."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

pytest.importorskip("triton")

from tests.cuda.opaque import check_opaque  # noqa: E402
from tests.quant.specs import SPECS  # noqa: E402
from torch_ascend_moe._registry import CUDA_KERNELS  # noqa: E402
from torch_ascend_moe.backends.cuda import _quant, _triton  # noqa: E402
from torch_ascend_moe.backends.cuda import quant as kernels  # noqa: E402
from torch_ascend_moe.backends.cuda._triton import tl, triton  # noqa: E402
from torch_ascend_moe.testing import campaign  # noqa: E402

pytestmark = pytest.mark.skipif(
    not _triton.INTERPRETED, reason="Triton's interpreter is off in this process (a GPU compiles the kernels)"
)
CASTS = [s for s in SPECS if s.name in ("quantize_fp8", "quantize_fp4")]


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 1:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def test_registered():
    assert {n for n, k in CUDA_KERNELS.items() if k == "triton: _quant"} == {"quantize_fp8", "quantize_fp4"}


@pytest.mark.parametrize("spec", CASTS, ids=str)
def test_spec_samples_bitwise_the_cpu_kernel(spec):
    for dtype in spec.dtypes:
        for s in spec.sample_inputs("cpu", dtype) + spec.sample_inputs("cpu", dtype, small=True):
            out, ours = getattr(kernels, spec.name)(*s.args), spec.op(*s.args)
            assert all(_bitwise(a, b) for a, b in zip(out, ours, strict=True)), (spec.name, s.name, dtype)


@settings(max_examples=25, deadline=None)  # the interpreter runs each program in Python: small tensors
@given(
    m=st.integers(1, 12),
    n=st.integers(1, 40).map(lambda v: 2 * v),
    block=st.sampled_from([[1, 128], [1, 32], [128, 128], [32, 32], [3, 4], [4, 1], [1, 6]]),
    ue8m0=st.booleans(),
    packed=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    scale=st.sampled_from([1.0, 1e-30, 1e-6, 1e30]),
    special=st.sampled_from([None, "nan", "inf", "-inf", "zero"]),
    seed=st.integers(0, 2**16),
)
def test_random_calls_bitwise_the_cpu_kernel(m, n, block, ue8m0, packed, dtype, scale, special, seed):
    x = (torch.randn(m, n, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)
    if special == "zero":
        x[: m // 2] = 0
    elif special is not None:
        x[m // 2, n // 2] = float(special)
    packed = packed and ue8m0
    for name in ("quantize_fp8", "quantize_fp4"):
        args = (x, block, ue8m0, packed)
        out, ours = getattr(kernels, name)(*args), getattr(torch.ops.ascend_moe, name)(*args)
        assert all(_bitwise(a, b) for a, b in zip(out, ours, strict=True)), name


@triton.jit
def _e4m3_kernel(x, out, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + i, _quant._e4m3_codes(tl.load(x + i, mask=i < N)), mask=i < N)


def test_e4m3_rounding_is_torchs_on_every_bf16_value():
    """Every BF16 bit pattern (as FP32) and random FP32 values of every magnitude: the same E4M3 byte as torch's
    conversion (nearest even, subnormals, saturating at 448, inf included, the sign of NaN kept)."""
    every = torch.arange(1 << 16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    g = torch.Generator().manual_seed(0)
    wide = torch.randn(1 << 15, generator=g) * torch.pow(2.0, torch.randint(-40, 12, (1 << 15,), generator=g).float())
    for x in (every, wide):
        out = torch.empty(x.shape, dtype=torch.uint8)
        _e4m3_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        assert torch.equal(out, x.to(torch.float8_e4m3fn).view(torch.uint8))


@pytest.mark.parametrize("spec", CASTS, ids=str)
def test_bad_inputs_raise_our_errors(spec):
    for bad in spec.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            getattr(kernels, spec.name)(*bad.args)


@pytest.mark.parametrize("spec", CASTS, ids=str)
def test_hostile_inputs_agree_with_the_cpu_kernel(spec):
    samples = spec.sample_inputs("cpu", torch.float32, small=True)[:2]
    problems, count = campaign.kernel_problems(spec, getattr(kernels, spec.name), samples)
    assert count and not problems, "\n".join(problems[:5])


@pytest.mark.parametrize("spec", CASTS, ids=str)
def test_opcheck_and_compile_through_an_opaque_op(spec):
    samples = [s for s in spec.sample_inputs("cpu", torch.float32, small=True) if s.args[0].numel()]
    check_opaque(spec.name, getattr(kernels, spec.name), samples[:2])
