"""Launching our Triton kernels: on CUDA tensors through ``torch.library.wrap_triton`` (so a kernel launched
inside a ``triton_op`` or traced code is visible to the compiler), on CPU tensors through Triton's interpreter
(what CI runs: no GPU there; the same kernel source, numpy underneath). Imported only by the family modules'
Triton parts, which need ``triton`` installed (CUDA builds of torch ship it; CI installs it as a test
dependency)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from torch_ascend_moe.quant.encodings import FP8_MAX


def interpreting(kernel) -> bool:
    """Whether ``kernel`` is Triton's interpreter's (``TRITON_INTERPRET=1`` when ``triton`` was imported: the test
    suite sets it on a machine without a GPU; triton's own ``tl`` helpers are JIT functions otherwise, which only
    a GPU compile can call)."""
    return isinstance(kernel, InterpretedFunction)


# Set to a list by tests/cuda/test_triton_compiles.py: each launch appends (kernel, grid, args, meta), so the
# interpreted launches can be compiled for a GPU afterwards (the interpreter runs code the compiler rejects).
RECORDED: list | None = None


def launch(kernel, grid, *args, **meta) -> None:
    """``kernel[grid](*args, **meta)``: compiled for the GPU through ``torch.library.wrap_triton`` (visible to the
    compiler when traced), or run by the interpreter (CPU tensors, tests)."""
    # No fused multiply-adds: ptxas contracts a separate multiply and add into one FMA (one rounding) unless Triton
    # emits them as .rn instructions, and the C++ kernels (built without FMA contraction) round twice; the kernels
    # that are bit for bit the C++ ones need that (found on an H200: moe_unpermute's weighted FP32 sums).
    meta.setdefault("enable_fp_fusion", False)
    if RECORDED is not None:
        RECORDED.append((kernel, grid, args, meta))
    if interpreting(kernel):
        kernel[grid](*args, **meta)
        return
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    if device.type != "cuda":
        raise RuntimeError(
            f"{kernel.__name__}: a Triton kernel got {device.type} tensors; run with TRITON_INTERPRET=1 set before "
            "triton is imported to interpret it on the CPU"
        )
    torch.library.wrap_triton(kernel)[grid](*args, **meta)


def device_refusal(device: torch.device, min_capability: tuple[int, int] = (8, 9)) -> str | None:
    """Why our Triton kernels do not run on ``device``, or None when they do: a CUDA GPU of at least
    ``min_capability`` (FP8 ``tl.dot`` needs sm89+), or CPU tensors when the kernels are interpreted (tests)."""
    if device.type == "cpu":
        return None if INTERPRETED else "CPU tensors: Triton runs them only interpreted (TRITON_INTERPRET=1)"
    if device.type != "cuda":
        return f"{device.type} tensors: Triton kernels run on CUDA"
    capability = torch.cuda.get_device_capability(device)
    if capability < min_capability:
        return f"needs sm{min_capability[0]}{min_capability[1]}+, this GPU is sm{capability[0]}{capability[1]}"
    return None


@triton.jit
def _probe():
    pass


INTERPRETED = interpreting(_probe)


@triton.jit
def div_rn(a, b):
    """``a / b`` rounded to nearest, as IEEE (and the C++ kernels) divide: Triton's ``/`` on FP32 is the GPU's
    approximate ``div.full.f32`` (up to 2 ulps; found on an H200 as one FP4 code past a cast's midpoint), which the
    interpreter does not show."""
    return tl.math.div_rn(a, b)


@triton.jit
def _bf16_bits(x):
    """FP32 bits of ``x`` rounded to BF16, nearest even (the low 16 bits zero). NaN stays NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return tl.where(x != x, bits | 0x00400000, rounded)  # a NaN's mantissa must not round into inf


@triton.jit
def round_to_bf16(x):
    """FP32 -> BF16 rounded to nearest even, by bit arithmetic: Triton's interpreter truncates in ``.to(bfloat16)``
    (3.9), the GPU rounds; spelled out, both give torch's rounding. NaN stays NaN."""
    return (_bf16_bits(x) >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def bf16_value(x):
    """FP32 ``x`` rounded to BF16 and kept as FP32 (an FP32 epilogue on a BF16-rounded value, without a BF16 -> FP32
    conversion, which the interpreter does not make exact)."""
    return _bf16_bits(x).to(tl.float32, bitcast=True)


@triton.jit
def store_result(ptr, value, mask, OUT_BF16: tl.constexpr):
    """Store FP32 ``value`` as the output's dtype: BF16 rounded to nearest even (torch's rounding), else FP32."""
    if OUT_BF16:
        tl.store(ptr, round_to_bf16(value), mask=mask)
    else:
        tl.store(ptr, value, mask=mask)


@triton.jit
def decode_ue8m0(code):
    """FP32 ``2^(code - 127)`` of UE8M0 codes (uint8): code 0 is the subnormal 2^-127, 255 is NaN."""
    e = code.to(tl.int32)
    bits = tl.where(e == 0, 0x00400000, e << 23)
    value = bits.to(tl.float32, bitcast=True)
    return tl.where(e == 255, float("nan"), value)


@triton.jit
def decode_e2m1_to_e4m3(byte, HIGH: tl.constexpr):
    """The E2M1 code in the low (or high) nibble of ``byte`` (uint8) as the E4M3 value it equals (every E2M1
    value is an E4M3 value), so FP4 operands meet FP8 ones in one FP8 ``tl.dot``."""
    c = byte.to(tl.int32)
    if HIGH:
        c = c >> 4
    c = c & 0xF
    mag = c & 7
    # 0.5 is E4M3 0x30; 1..6 have exponent (mag >> 1) + 6 (bias 7) and mantissa bit mag & 1 on its top bit.
    e4m3 = tl.where(mag >= 2, (((mag >> 1) + 6) << 3) | ((mag & 1) << 2), tl.where(mag == 1, 0x30, 0))
    return (e4m3 | ((c & 8) << 4)).to(tl.uint8).to(tl.float8e4nv, bitcast=True)


@triton.jit
def load_scales(ptr, mask, UE8M0: tl.constexpr):
    """FP32 block scales at ``ptr`` (FP32, or UE8M0 codes); 1 where ``mask`` is off."""
    if UE8M0:
        scales = tl.where(mask, decode_ue8m0(tl.load(ptr, mask=mask, other=127)), 1.0)
    else:
        scales = tl.load(ptr, mask=mask, other=1.0).to(tl.float32)
    return scales


# FP8_MAX as a @triton.jit body can read a module global: tl.constexpr (folded at compile time).
_E4M3_MAX: tl.constexpr = tl.constexpr(FP8_MAX)


@triton.jit
def _finite(x):
    return tl.abs(x) < float("inf")


@triton.jit
def scale_product(a_s, b_s):
    """(``a_s[:, None] * b_s[None, :]``, where scaling a chunk's FP32 sums by it equals summing scaled values):
    unless a value times its scale (|x| <= 448) or the product is not finite, or the product underflows to 0 from
    nonzero scales. Where it does not, the caller dequantizes in the tile instead."""
    s = a_s[:, None] * b_s[None, :]
    regular = _finite(a_s * _E4M3_MAX)[:, None] & _finite(b_s * _E4M3_MAX)[None, :] & _finite(s)
    return s, regular & ((s != 0) | (a_s[:, None] == 0) | (b_s[None, :] == 0))


__all__ = [
    "bf16_value",
    "decode_e2m1_to_e4m3",
    "decode_ue8m0",
    "device_refusal",
    "interpreting",
    "launch",
    "round_to_bf16",
    "store_result",
    "tl",
    "triton",
]
