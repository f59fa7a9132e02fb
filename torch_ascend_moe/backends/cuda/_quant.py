"""The Triton kernel behind ``quantize_fp8`` / ``quantize_fp4`` on CUDA: DeepGEMM's casts, bit for bit the reference
(``quant.reference``) and the C++ kernel. One program per ``[rows, cols]`` block: ``amax`` in FP32, floored at 1e-4,
over the format's maximum is the scale (rounded up to a power of two with UE8M0), the block is multiplied by the
scale's reciprocal and rounded: to E4M3 by torch's rounding (to nearest even, saturating at 448, subnormals below
2^-6), written out with integer arithmetic so the GPU and Triton's interpreter give the same bits; to E2M1 by
DeepGEMM's midpoints (ties to the smaller magnitude), two codes per byte, low nibble first. A block holding NaN
gets a NaN scale (and NaN codes), as the reference. Ragged blocks count only their elements (zero padding never
raises ``amax``). Scales are FP32 ``[M/gr, N/gc]``, or UE8M0 codes packed four per int32 (a ragged count padded
with 1.0), written by the caller from the FP32 ones.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.cuda._triton import device_refusal, div_rn, launch, round_to_bf16, tl, triton
from torch_ascend_moe.quant.encodings import E4M3_AMAX_FLOOR, FP4_MAX, FP8_MAX

# The encodings' constants as a @triton.jit body can read a module global: tl.constexpr (folded at compile time).
_AMAX_FLOOR: tl.constexpr = tl.constexpr(E4M3_AMAX_FLOOR)
_E4M3_MAX: tl.constexpr = tl.constexpr(FP8_MAX)
_E2M1_MAX: tl.constexpr = tl.constexpr(FP4_MAX)

MAX_BLOCK_ELEMENTS = 1 << 14  # elements one program holds (128 x 128)


def refusal(x: torch.Tensor, block) -> str | None:
    """Why the cast kernel does not take a call, or None: one program holds one block."""
    gr, gc = block
    if triton.next_power_of_2(gr) * triton.next_power_of_2(gc) > MAX_BLOCK_ELEMENTS:
        return f"blocks of {gr} x {gc} exceed one program ({MAX_BLOCK_ELEMENTS} elements)"
    return device_refusal(x.device)


def quantize(x: torch.Tensor, block, use_ue8m0: bool, fp4: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(data, FP32 scales ``[ceil(M/gr), ceil(N/gc)]``) of ``x [M, N]`` (blocks cut to the tensor as the reference
    cuts them): E4M3 ``[M, N]``, or uint8 ``[M, N/2]`` E2M1 codes."""
    m, n = x.shape
    gr, gc = min(block[0], max(m, 1)), min(block[1], max(n, 1))
    rows, cols = triton.cdiv(m, gr), triton.cdiv(n, gc)
    scales = torch.empty(rows, cols, dtype=torch.float32, device=x.device)
    if fp4:
        data = torch.empty(m, n // 2, dtype=torch.uint8, device=x.device)
    else:
        data = torch.empty(m, n, dtype=torch.float8_e4m3fn, device=x.device)
    if m and n:
        launch(
            _quantize_kernel,
            (rows, cols),
            x,
            data.view(torch.uint8),
            scales,
            m,
            n,
            x.stride(0),
            x.stride(1),
            data.stride(0),
            scales.stride(0),
            GR=gr,
            GC=gc,
            BR=triton.next_power_of_2(gr),
            BC=triton.next_power_of_2(gc),
            FP4=fp4,
            UE8M0=use_ue8m0,
        )
    return data, scales


@triton.jit
def _bits(x):
    return x.to(tl.uint32, bitcast=True)


@triton.jit
def _ceil_pow2(sf):
    """The smallest power of two >= ``sf`` (positive FP32), biased exponent clamped to [1, 254]; NaN stays NaN."""
    b = _bits(sf)
    e = ((b >> 23) & 0xFF) + tl.where((b & 0x7FFFFF) != 0, 1, 0)
    e = tl.minimum(tl.maximum(e, 1), 254)
    return tl.where(sf != sf, sf, (e << 23).to(tl.float32, bitcast=True))


@triton.jit
def _e4m3_codes(v):
    """E4M3 (fn) bytes of FP32 ``v``, torch's conversion: round to nearest even; magnitudes from 448 up (inf
    included) saturate to 448; NaN is NaN (0x7F with its sign); below 2^-6 the subnormal grid."""
    b = _bits(v)
    sign = b & 0x80000000
    a = b ^ sign
    nan = a > 0x7F800000
    saturated = a >= 0x43E00000  # 448.0, the largest finite
    small = a < (121 << 23)  # below 2^-6
    # Subnormals: adding 2^14 (bits 141 << 23) rounds the value onto E4M3's subnormal grid (2^-9), to nearest even.
    denorm = a.to(tl.float32, bitcast=True) + 16384.0
    sub = _bits(denorm) - (141 << 23)
    # Normals: rebias the exponent (127 -> 7) and round the mantissa's low 20 bits to nearest even.
    odd = (a >> 20) & 1
    normal = (a - (120 << 23) + 0x7FFFF + odd) >> 20
    code = tl.where(nan, 0x7F, tl.where(saturated, 0x7E, tl.where(small, sub, normal)))
    return (code | (sign >> 24)).to(tl.uint8)


@triton.jit
def cast_rows_e4m3(v, UE8M0: tl.constexpr):
    """(E4M3 codes, FP32 scale per row) of FP32 ``v [R, C]``, each row one 1 x C block of ``quantize_fp8``: amax
    floored at 1e-4 over 448 (a power of two with UE8M0; NaN for a row holding NaN), values times its reciprocal.
    Zeros in ``v`` stand for masked elements (they never raise the amax)."""
    amax = tl.max(tl.abs(v), axis=1)
    has_nan = tl.max(tl.where(v != v, 1, 0), axis=1) > 0
    sf = tl.where(has_nan, float("nan"), div_rn(tl.maximum(amax, _AMAX_FLOOR), _E4M3_MAX))
    if UE8M0:
        sf = _ceil_pow2(sf)
    return _e4m3_codes(v * div_rn(1.0, sf)[:, None]), sf


@triton.jit
def _e2m1_codes(v):
    """E2M1 codes (0..15) of ``v`` (already in [-6, 6], or NaN): DeepGEMM's midpoints, ties to the smaller."""
    mag = tl.abs(v)
    code = (mag > 0.25).to(tl.int32) + (mag > 0.75) + (mag > 1.25) + (mag > 1.75)
    code = code + (mag > 2.5) + (mag > 3.5) + (mag > 5.0)
    sign = tl.where((v < 0) & (code != 0), 8, 0)
    return code | sign


@triton.jit
def _quantize_kernel(
    x,
    data,
    scales,
    M,
    N,
    s_xm,
    s_xn,
    s_dm,
    s_sm,
    GR: tl.constexpr,
    GC: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
    FP4: tl.constexpr,
    UE8M0: tl.constexpr,
):
    rb, cb = tl.program_id(0), tl.program_id(1)
    r = rb * GR + tl.arange(0, BR)
    row_ok = (tl.arange(0, BR) < GR)[:, None] & (r < M)[:, None]
    rows = r.to(tl.int64)[:, None] * s_xm
    if FP4:
        # The even and odd columns of the block as two [BR, BC / 2] tiles: byte j of a row packs columns 2j (low
        # nibble) and 2j + 1.
        j = tl.arange(0, BC // 2)
        c = cb * GC + 2 * j
        ok = row_ok & (2 * j < GC)[None, :] & (c < N)[None, :]
        v = tl.load(x + rows + c[None, :] * s_xn, mask=ok, other=0.0).to(tl.float32)
        ok2 = ok & (2 * j + 1 < GC)[None, :] & (c + 1 < N)[None, :]
        v2 = tl.load(x + rows + (c + 1)[None, :] * s_xn, mask=ok2, other=0.0).to(tl.float32)
        amax = tl.maximum(tl.max(tl.max(tl.abs(v), axis=1), axis=0), tl.max(tl.max(tl.abs(v2), axis=1), axis=0))
        has_nan = tl.max(tl.max(tl.where((v != v) | (v2 != v2), 1, 0), axis=1), axis=0) > 0
    else:
        c = cb * GC + tl.arange(0, BC)
        ok = row_ok & (tl.arange(0, BC) < GC)[None, :] & (c < N)[None, :]
        v = tl.load(x + rows + c[None, :] * s_xn, mask=ok, other=0.0).to(tl.float32)
        v2 = v
        amax = tl.max(tl.max(tl.abs(v), axis=1), axis=0)
        has_nan = tl.max(tl.max(tl.where(v != v, 1, 0), axis=1), axis=0) > 0
    fmt_max = _E2M1_MAX if FP4 else _E4M3_MAX
    sf = div_rn(tl.maximum(amax, _AMAX_FLOOR), fmt_max)
    sf = tl.where(has_nan, float("nan"), sf)
    if UE8M0:
        sf = _ceil_pow2(sf)
    tl.store(scales + rb * s_sm + cb, sf)
    out = data + r.to(tl.int64)[:, None] * s_dm
    if FP4:
        inv = div_rn(1.0, sf)
        byte = _e2m1_codes(v * inv) | (_e2m1_codes(v2 * inv) << 4)
        tl.store(out + (cb * (GC // 2) + j)[None, :], byte.to(tl.uint8), mask=ok)
    else:
        tl.store(out + c[None, :], _e4m3_codes(v * div_rn(1.0, sf)), mask=ok)


DEQUANT_ROWS, DEQUANT_COLS = 32, 128  # elements one dequantize program covers


def dequantize_refusal(data: torch.Tensor) -> str | None:
    """No FP8 arithmetic in the dequantize kernel (integer decoding): any GPU from sm80."""
    return device_refusal(data.device, (8, 0))


def dequantize(data: torch.Tensor, scale: torch.Tensor, block, out_dtype: torch.dtype) -> torch.Tensor:
    """``dequantize``'s values: ``data`` (E4M3 ``[M, N]`` or packed E2M1 ``[M, N/2]``) times its block's FP32
    scale (``scale [ceil(M/gr), ceil(N/gc)]``, any strides), rounded once to ``out_dtype``; row-major. Codes are
    decoded with integer arithmetic (exact on the GPU and in the interpreter), any block shape."""
    fp4 = data.dtype == torch.uint8
    m, n = data.shape[0], data.shape[1] * (2 if fp4 else 1)
    gr, gc = min(block[0], max(m, 1)), min(block[1], max(n, 1))
    out = torch.empty(m, n, dtype=out_dtype, device=data.device)
    if m and n:
        launch(
            _dequantize_kernel,
            (triton.cdiv(m, DEQUANT_ROWS), triton.cdiv(n, DEQUANT_COLS)),
            data.view(torch.uint8),
            scale,
            out,
            m,
            n,
            gr,
            gc,
            data.stride(0),
            data.stride(1),
            scale.stride(0),
            scale.stride(1),
            BR=DEQUANT_ROWS,
            BC=DEQUANT_COLS,
            FP4=fp4,
            OUT_BF16=out_dtype == torch.bfloat16,
        )
    return out


@triton.jit
def _e4m3_value(code):
    """FP32 value of E4M3 (fn) codes (int32 0..255): subnormals ``m * 2^-9``, normals rebiased (7 -> 127) bit for
    bit, 0x7F / 0xFF NaN."""
    sign = (code & 0x80) << 24
    e, m = (code >> 3) & 0xF, code & 7
    normal = (sign | ((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = tl.where(sign != 0, -1.0, 1.0) * m.to(tl.float32) * 0.001953125
    value = tl.where(e == 0, sub, normal)
    return tl.where((code & 0x7F) == 0x7F, float("nan"), value)


@triton.jit
def _e2m1_value(code):
    """FP32 value of E2M1 codes (int32 0..15): magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6, bit 3 the sign."""
    mag, e = code & 7, (code >> 1) & 3
    normal = (1.0 + (mag & 1).to(tl.float32) * 0.5) * tl.where(e == 3, 4.0, tl.where(e == 2, 2.0, 1.0))
    value = tl.where(e == 0, (mag & 1).to(tl.float32) * 0.5, normal)
    return tl.where((code & 8) != 0, -value, value)


@triton.jit
def _dequantize_kernel(
    data,
    scale,
    out,
    M,
    N,
    GR,
    GC,
    s_dm,
    s_dn,
    s_sm,
    s_sn,
    BR: tl.constexpr,
    BC: tl.constexpr,
    FP4: tl.constexpr,
    OUT_BF16: tl.constexpr,
):
    r = tl.program_id(0) * BR + tl.arange(0, BR)
    c = tl.program_id(1) * BC + tl.arange(0, BC)
    ok = (r < M)[:, None] & (c < N)[None, :]
    rows = r.to(tl.int64)[:, None]
    if FP4:  # element c is nibble c % 2 (low first) of byte c // 2
        byte = tl.load(data + rows * s_dm + (c // 2)[None, :] * s_dn, mask=ok, other=0).to(tl.int32)
        v = _e2m1_value((byte >> ((c % 2) * 4)[None, :]) & 0xF)
    else:
        v = _e4m3_value(tl.load(data + rows * s_dm + c[None, :] * s_dn, mask=ok, other=0).to(tl.int32))
    sf = tl.load(scale + (r // GR).to(tl.int64)[:, None] * s_sm + (c // GC)[None, :] * s_sn, mask=ok, other=1.0)
    y = v * sf
    at = out + rows * N + c[None, :]
    if OUT_BF16:
        tl.store(at, round_to_bf16(y), mask=ok)
    else:
        tl.store(at, y.to(out.dtype.element_ty), mask=ok)


__all__ = ["cast_rows_e4m3", "dequantize", "dequantize_refusal", "quantize", "refusal"]
