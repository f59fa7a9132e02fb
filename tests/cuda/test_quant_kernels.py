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

from tests.chains import cuda_chain as kernels  # noqa: E402
from tests.chains import ops_running  # noqa: E402
from tests.cuda.opaque import check_opaque  # noqa: E402
from tests.quant.specs import SPECS  # noqa: E402
from torch_ascend_moe.backends.cuda import _quant, _triton  # noqa: E402
from torch_ascend_moe.backends.cuda._triton import tl, triton  # noqa: E402
from torch_ascend_moe.testing import campaign  # noqa: E402

pytestmark = pytest.mark.skipif(
    not _triton.INTERPRETED, reason="Triton's interpreter is off in this process (a GPU compiles the kernels)"
)
CASTS = [s for s in SPECS if s.name in ("quantize_fp8", "quantize_fp4")]
KERNELS = [s for s in SPECS if s.name in ("quantize_fp8", "quantize_fp4", "dequantize")]


def _outs(out) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _bitwise(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.element_size() == 1:
        return torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


def test_registered():
    assert ops_running("cuda", "triton: _quant") == {s.name for s in KERNELS}


@pytest.mark.parametrize("spec", KERNELS, ids=str)
def test_spec_samples_bitwise_the_cpu_kernel(spec):
    for dtype in spec.dtypes:
        for s in spec.sample_inputs("cpu", dtype) + spec.sample_inputs("cpu", dtype, small=True):
            out, ours = _outs(getattr(kernels, spec.name)(*s.args)), _outs(spec.op(*s.args))
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


@pytest.mark.parametrize("spec", KERNELS, ids=str)
def test_bad_inputs_raise_our_errors(spec):
    for bad in spec.bad_inputs("cpu"):
        with pytest.raises(bad.error, match=bad.match):
            getattr(kernels, spec.name)(*bad.args)


@pytest.mark.parametrize("spec", KERNELS, ids=str)
def test_hostile_inputs_agree_with_the_cpu_kernel(spec):
    samples = spec.sample_inputs("cpu", torch.float32, small=True)[:2]
    problems, count = campaign.kernel_problems(spec, getattr(kernels, spec.name), samples)
    assert count and not problems, "\n".join(problems[:5])


@pytest.mark.parametrize("spec", KERNELS, ids=str)
def test_opcheck_and_compile_through_an_opaque_op(spec):
    samples = [s for s in spec.sample_inputs("cpu", torch.float32, small=True) if s.args[0].numel()]
    check_opaque(spec.name, getattr(kernels, spec.name), samples[:2])


def test_dequantize_decodes_every_code_as_torch():
    """Every E4M3 byte (NaN codes, -0, subnormals) and every E2M1 nibble pair, scale 1, FP32 out: torch's own
    conversion (E4M3) and the E2M1 table, bit for bit."""
    codes = torch.arange(256, dtype=torch.uint8).view(16, 16)
    one = torch.ones(1, 1)
    for data, block, want in (
        (codes.view(torch.float8_e4m3fn), [16, 16], codes.view(torch.float8_e4m3fn).float()),
        (codes, [16, 32], torch.ops.ascend_moe.dequantize(codes, one, [16, 32])),
    ):
        out = kernels.dequantize(data, one, block, torch.float32)
        nan = out.isnan()
        assert torch.equal(nan, want.isnan())
        assert torch.equal(out.view(torch.int32)[~nan], want.view(torch.int32)[~nan])  # -0.0 included


def _scales_as(sf: torch.Tensor, fmt: str) -> torch.Tensor:
    """FP32 power-of-two scales in ``fmt``: FP32 itself, E8M0, or UE8M0 codes packed in int32 / int16."""
    if fmt == "fp32":
        return sf
    codes = ((sf.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    if fmt == "e8m0":
        return codes.view(torch.float8_e8m0fnu)
    per = 4 if fmt == "int32" else 2
    cols = -(-codes.shape[1] // per) * per
    codes = torch.nn.functional.pad(codes, (0, cols - codes.shape[1]), value=127)
    return codes.view(torch.int32 if per == 4 else torch.int16)


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(1, 40),
    n=st.integers(1, 70).map(lambda v: 2 * v),
    block=st.sampled_from([[1, 128], [1, 32], [128, 128], [32, 32], [3, 4], [4, 2], [1, 6], [7, 1]]),
    fp4=st.booleans(),
    fmt=st.sampled_from(["fp32", "fp32_any", "e8m0", "int32", "int16"]),
    out_dtype=st.sampled_from([None, torch.float32, torch.bfloat16, torch.float16, torch.float64]),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_dequantize_random_calls_bitwise_the_cpu_kernel(m, n, block, fp4, fmt, out_dtype, strided, seed):
    """Random codes (every byte value: NaN codes included), blocks cut to the tensor, scales in every format (FP32
    ones of any value: NaN, inf, 0, huge, tiny), every output dtype, column-strided data: the C++ kernel's bits."""
    if fp4 and block[1] % 2:
        block = [block[0], block[1] + 1]
    g = torch.Generator().manual_seed(seed)
    width = n // 2 if fp4 else n
    raw = torch.randint(0, 256, (m, 2 * width if strided else width), generator=g, dtype=torch.uint8)
    codes = raw if fp4 else raw.view(torch.float8_e4m3fn)
    data = codes[:, ::2] if strided else codes
    rows, cols = -(-m // min(block[0], m)), -(-n // min(block[1], n))
    if fmt == "fp32_any":
        sf = torch.randn(rows, cols, generator=g) * torch.pow(10.0, torch.randint(-30, 30, (rows, cols), generator=g))
        special = sf.view(-1)[:: max(1, sf.numel() // 3)]  # a view: up to three blocks get NaN, inf, 0
        special.copy_(torch.tensor([float("nan"), float("inf"), 0.0]).repeat(3)[: special.numel()])
    else:
        sf = torch.pow(2.0, torch.randint(-20, 20, (rows, cols), generator=g).float())
    scale = _scales_as(sf, "fp32" if fmt == "fp32_any" else fmt)
    args = (data, scale, block, out_dtype)
    out, ours = kernels.dequantize(*args), torch.ops.ascend_moe.dequantize(*args)
    assert _bitwise(out, ours) and out.stride() == ours.stride()
