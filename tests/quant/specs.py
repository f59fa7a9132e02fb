"""Sample inputs, bad inputs and the harness specs of the quant family (quantize_fp8, quantize_fp4, dequantize,
quantize_blocks).

``dtype`` is the high-precision input dtype of the quantize ops and the output dtype of ``dequantize``. The
quantize references are DeepGEMM's reference math (``quant.reference``, plain torch), so the numerics check
expects the same values exactly (calc_diff 0); tests/quant/test_quant_ops.py checks every bit. The dequantize
reference multiplies in fp64.
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe import quant
from torch_ascend_moe.backends.portable import quant as portable
from torch_ascend_moe.quant import reference
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

# (M, N, block, use_ue8m0, use_packed_ue8m0, stored transposed)
_QUANTIZE_CASES = [
    (33, 300, [1, 128], False, False, False),
    (256, 40, [128, 1], True, False, False),
    (300, 260, [128, 128], True, False, True),
    (16, 512, [1, 128], True, True, False),
    (7, 10, [3, 4], True, True, False),
    (5, 96, [1, 32], False, False, True),
    (0, 128, [1, 128], True, True, False),
    (4, 0, [1, 128], False, False, False),
]
_QUANTIZE_CASES_SMALL = [
    (4, 64, [1, 32], False, False, False),
    (6, 10, [3, 4], True, True, True),
    (8, 6, [4, 1], True, False, False),
    (0, 8, [1, 8], False, False, False),
]


def _high_precision(m, n, dtype, device, transposed, generator):
    """Rows of very different magnitudes (the scales differ), one row of zeros (the 1e-4 amax floor)."""
    x = torch.randn(m, n, generator=generator, dtype=torch.float64)
    x *= 10.0 ** torch.randint(-6, 7, (m, 1), generator=generator)
    if m > 2:
        x[1] = 0.0
    if transposed:
        x = x.t().contiguous().t()
    return x.to(dtype=dtype, device=device)


def _quantize_samples(fp4: bool):
    def samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
        g = torch.Generator().manual_seed(21 + fp4)
        out = []
        for m, n, block, ue8m0, packed, transposed in _QUANTIZE_CASES_SMALL if small else _QUANTIZE_CASES:
            x = _high_precision(m, n, dtype, device, transposed, g).requires_grad_(requires_grad)
            name = f"M{m}N{n} block={block}{' ue8m0' if ue8m0 else ''}{' packed' if packed else ''}"
            out.append(SampleInput((x, block, ue8m0, packed), name + (" transposed" if transposed else "")))
        return out

    return samples


def _exact_values(outputs):
    """The reference's outputs as the harness compares them: FP8 codes as their fp64 values, the rest as is."""
    return tuple(t.double() if t.dtype == torch.float8_e4m3fn or t.dtype == torch.float32 else t for t in outputs)


def quantize_fp8_reference(x, block, use_ue8m0, use_packed_ue8m0):
    return _exact_values(reference.quantize_fp8(x.detach(), block, use_ue8m0, use_packed_ue8m0))


def quantize_fp4_reference(x, block, use_ue8m0, use_packed_ue8m0):
    return _exact_values(reference.quantize_fp4(x.detach(), block, use_ue8m0, use_packed_ue8m0))


def _quantize_bad_inputs(fp4: bool):
    def bad_inputs(device) -> list[BadInput]:
        x = torch.randn(4, 256, generator=torch.Generator().manual_seed(23))
        cases = [
            BadInput((x[0], [1, 128], False, False), r"argument 'x' rank: expected 2-D \[M, N\]", "rank"),
            BadInput(
                (x.to(torch.int32), [1, 128], False, False),
                r"argument 'x' dtype: expected one of torch.bfloat16, .*, got torch.int32",
                "dtype",
            ),
            BadInput(
                (x, [0, 128], False, False),
                r"argument 'block' value: expected \[rows, cols\] with positive entries, got \[0, 128\]",
                "block",
            ),
            BadInput((x, [1, 128, 1], False, False), r"argument 'block' value: expected \[rows, cols\]", "block len"),
            BadInput((x, [1, 2**31], False, False), r"argument 'block' value: .* at most 2147483647", "block big"),
            BadInput(
                (x, [1, 128], False, True),
                r"argument 'use_packed_ue8m0' value: expected False unless use_ue8m0, got True",
                "packed",
            ),
        ]
        if fp4:
            cases.append(
                BadInput(
                    (x[:, :255], [1, 128], True, False),
                    r"argument 'x' size\(1\): expected an even number \(two E2M1 codes per byte\), got 255",
                    "odd N",
                )
            )
        return cases

    return bad_inputs


def _e8m0(sf):
    return sf.to(torch.float8_e8m0fnu)


def _int16(sf):
    return quant.repack_ue8m0(sf, torch.int16)


# (M, N, fp4, block, use_ue8m0, use_packed_ue8m0, scale conversion)
_DEQUANTIZE_CASES = [
    (33, 300, False, [1, 128], False, False, None),
    (300, 260, False, [128, 128], True, False, _e8m0),
    (16, 512, False, [1, 128], True, True, None),
    (6, 100, False, [1, 32], True, True, _int16),
    (9, 64, True, [1, 32], False, False, None),
    (4, 96, True, [1, 32], True, True, None),
    (7, 11, False, [3, 5], False, False, None),
    (0, 128, False, [1, 128], False, False, None),
]
_DEQUANTIZE_CASES_SMALL = [
    (4, 64, False, [1, 32], False, False, None),
    (6, 10, True, [3, 4], True, True, None),
    (5, 8, False, [2, 8], True, False, _e8m0),
    (0, 8, True, [1, 8], False, False, None),
]


def dequantize_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(24)
    out = []
    for i, (m, n, fp4, block, ue8m0, packed, convert) in enumerate(
        _DEQUANTIZE_CASES_SMALL if small else _DEQUANTIZE_CASES
    ):
        x = _high_precision(m, n, torch.float32, "cpu", False, g)
        cast = reference.quantize_fp4 if fp4 else reference.quantize_fp8
        data, scale = cast(x, block, ue8m0, packed)
        scale = scale if convert is None else convert(scale)
        # Only an FP32 scale is differentiable; the data are codes.
        scale = scale.to(device).requires_grad_(requires_grad and scale.dtype == torch.float32)
        out_dtype = dtype if dtype == torch.float64 or i % 2 == 0 else None
        name = f"M{m}N{n} {'fp4' if fp4 else 'fp8'} block={block} scale {scale.dtype} out {out_dtype}"
        out.append(SampleInput((data.to(device), scale, block, out_dtype), name))
    return out


def dequantize_reference(data, scale, block, out_dtype):
    """fp64 ``data * scale`` per block: the codes' exact values times the scales'."""
    values = quant.decode_e2m1(quant.unpack_e2m1(data)) if data.dtype == torch.uint8 else data.float()
    m, n = values.shape
    rows, cols = min(block[0], max(m, 1)), min(block[1], max(n, 1))
    full = quant.scales_to_float(scale.detach()).double().repeat_interleave(rows, 0)[:m]
    return values.double() * full.repeat_interleave(cols, 1)[:, :n]


def dequantize_bad_inputs(device) -> list[BadInput]:
    x = torch.randn(33, 300, generator=torch.Generator().manual_seed(25))
    q, sf = reference.quantize_fp8(x, [1, 128], False, False)
    qp, sfp = reference.quantize_fp8(x[:16], [1, 128], True, True)
    return [
        BadInput((q.unsqueeze(0), sf, [1, 128], None), r"argument 'data' rank: expected 2-D \[M, N\] \(FP8\)", "rank"),
        BadInput(
            (x, sf, [1, 128], None),
            r"argument 'data' dtype: expected torch.float8_e4m3fn, or torch.uint8 \(packed FP4\), got torch.float32",
            "data dtype",
        ),
        BadInput((q, sf, [1, 0], None), r"argument 'block' value: expected \[rows, cols\] with positive", "block"),
        BadInput((q, sf, [2**31, 1], None), r"argument 'block' value: .* at most 2147483647", "block big"),
        BadInput(
            (q, sf.to("meta"), [1, 128], None),
            r"argument 'scale' device: expected (cpu|cuda:0) \(same as 'data'\), got meta",
            "device",
        ),
        BadInput(
            (q, sf.half(), [1, 128], None),
            r"argument 'scale' dtype: expected torch.float32, torch.float8_e8m0fnu, torch.int32 or torch.int16",
            "scale dtype",
        ),
        BadInput(
            (q, sf[:, :2], [1, 128], None),
            r"argument 'scale' shape: expected \[33, 3\] \(ceil\(M / block\[0\]\), ceil\(N / block\[1\]\)\), "
            r"got \[33, 2\]",
            "scale shape",
        ),
        BadInput(
            (qp, sfp, [1, 32], None),
            r"argument 'scale' shape: expected \[16, 3\] "
            r"\(ceil\(M / block\[0\]\), ceil\(ceil\(N / block\[1\]\) / 4\)\)",
            "packed shape",
        ),
        BadInput(
            (q, sf, [1, 128], torch.int32),
            r"argument 'out_dtype' value: expected one of torch.bfloat16, .*, got torch.int32",
            "out_dtype",
        ),
    ]


# ---- quantize_blocks (TileKernels' cast rules) ----

# (M, N, block, fmt, round_sf, given sf, amax_clamp, stored transposed)
_BLOCK_CASES = [
    (33, 300, [1, 128], "e4m3", False, False, None, False),
    (33, 300, [1, 128], "e4m3", True, False, None, True),
    (130, 96, [128, 128], "e4m3", True, False, None, False),
    (256, 40, [128, 1], "e4m3", False, False, 1e-3, False),
    (17, 64, [1, 32], "e2m1", True, False, None, False),
    (9, 70, [1, 16], "e2m1", False, False, None, True),
    (40, 64, [32, 32], "e2m1", True, True, None, False),
    (12, 256, [1, 128], "e4m3", False, True, None, False),
    (0, 64, [1, 32], "e2m1", True, False, None, False),
    (21, 200, [1, 200], "e5m6", False, False, None, False),
    (13, 96, [1, 32], "e5m6", True, False, None, True),
    (5, 64, [1, 64], "e5m6", False, True, None, False),
]
_BLOCK_CASES_SMALL = [
    (4, 64, [1, 32], "e4m3", False, False, None, False),
    (6, 10, [3, 4], "e2m1", True, True, None, True),
]


def quantize_blocks_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(23)
    out = []
    for m, n, block, fmt, round_sf, given, clamp, transposed in _BLOCK_CASES_SMALL if small else _BLOCK_CASES:
        x = _high_precision(m, n, dtype, device, transposed, g).requires_grad_(requires_grad)
        sf = None
        if given:  # arbitrary positive scales (not powers of two)
            shape = (-(-m // block[0]), -(-n // block[1]))
            sf = (torch.rand(shape, generator=g) * 3 + 0.01).to(device)
        name = f"M{m}N{n} block={block} {fmt}{' round_sf' if round_sf else ''}{' sf' if given else ''} clamp={clamp}"
        out.append(SampleInput((x, fmt, block, round_sf, sf, clamp), name + (" transposed" if transposed else "")))
    return out


def _f32(v: float) -> float:
    """``v`` rounded to FP32 (the reference's arithmetic stays in FP32 as the kernels')."""
    return float(torch.tensor(v, dtype=torch.float32))


def _e2m1_bits(v: float) -> int:
    """E2M1 code of an FP32 value by bits: round to nearest even on the mantissa, saturate at code 7 (6.0)."""
    bits = int(torch.tensor([v], dtype=torch.float32).view(torch.int32)) & 0xFFFFFFFF
    sign, exponent, mantissa = bits >> 31, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exponent == 0xFF:
        return (sign << 3) | 7
    # The magnitude in units of 0.5 as an exact fraction: value = (1.m) * 2^(e - 127), or 0.m * 2^-126.
    significand = (mantissa | (1 << 23)) if exponent else mantissa
    shift = (exponent if exponent else 1) - 127 - 23 + 1  # value / 0.5 = significand * 2^shift
    if shift >= 0:
        halves, rest, half = significand << shift, 0, 1
    else:
        halves, rest, half = significand >> -shift, significand & ((1 << -shift) - 1), 1 << (-shift - 1)
    # Representable magnitudes in halves: 0, 1, 2, 3, 4, 6, 8, 12 (codes 0..7); pick the nearest, ties to even code.
    grid = [0, 1, 2, 3, 4, 6, 8, 12]
    exact = halves + (rest / (2 * half) if shift < 0 else 0)
    if exact >= 12:
        return (sign << 3) | 7
    code = max(c for c, h in enumerate(grid) if h <= exact)
    if code < 7 and exact > grid[code]:
        lower, upper = grid[code], grid[code + 1]
        midpoint = (lower + upper) / 2
        if exact > midpoint or (exact == midpoint and (code + 1) % 2 == 0):
            code += 1
    return (sign << 3) | code


def _e5m6_bits(v: float) -> int:
    """E5M6 code of an FP32 value by its bits, the spec's steps (§5.6): FP16 by truncation (IEEE ranges), then the 4
    low FP16 mantissa bits dropped, rounding to nearest even on the 17 low bits of the FP32 mantissa."""
    bits = int(torch.tensor([v], dtype=torch.float32).view(torch.int32)) & 0xFFFFFFFF
    sign, exponent, mantissa = (bits >> 16) & 0x8000, (bits >> 23) & 0xFF, bits & 0x7FFFFF
    if exponent == 0xFF:
        half = sign | (0x7FFF if mantissa else 0x7C00)
    elif exponent > 142:
        half = sign | 0x7C00
    elif exponent >= 113:
        half = sign | ((exponent - 112) << 10) | (mantissa >> 13)
    elif exponent >= 103:
        half = sign | ((0x800000 | mantissa) >> (113 - exponent + 13))
    else:
        half = sign
    code = half >> 4
    rest = bits & 0x1FFFF
    if rest > 0x10000 or (rest == 0x10000 and code & 1):
        code += 1
    return code & 0xFFF


def quantize_blocks_reference(x, fmt, block, round_sf, sf, amax_clamp):
    """The spec's steps element by element (§2): FP32 amax of the block's real elements, the floor, sf, the
    multiplier, E4M3 by the standard RNE conversion, E2M1 by bits."""
    x = x.detach().float().cpu()
    m, n = x.shape
    max_q = {"e4m3": 448.0, "e2m1": 6.0, "e5m6": 65024.0}[fmt]
    floor = amax_clamp if amax_clamp is not None else (6.0 * 2.0**-126 if fmt == "e2m1" else 1e-4)
    rows, cols = -(-m // block[0]), -(-n // block[1])
    scales = torch.zeros(rows, cols, dtype=torch.float32) if sf is None else sf.detach().cpu().clone()
    q = torch.zeros(m, n, dtype=torch.float32)
    for i in range(rows):
        for j in range(cols):
            part = x[i * block[0] : (i + 1) * block[0], j * block[1] : (j + 1) * block[1]]
            if sf is None:
                amax = max(_f32(float(part.abs().max())), _f32(floor))
                scale = _f32(amax / max_q)
                if round_sf:
                    scale = 2.0 ** math.ceil(math.log2(scale)) if scale > 0 else 0.0
                    multiplier = _f32(1 / scale)
                else:
                    multiplier = _f32(max_q / amax)
                scales[i, j] = scale
            else:
                multiplier = _f32(1 / float(scales[i, j]))
            q[i * block[0] : (i + 1) * block[0], j * block[1] : (j + 1) * block[1]] = part * multiplier
    if fmt == "e4m3":
        return q.clamp(-max_q, max_q).to(torch.float8_e4m3fn).double(), scales.double()
    if fmt == "e5m6":  # 8 codes -> three little-endian 32-bit words, most significant code first
        data = torch.zeros(m, n * 3 // 2, dtype=torch.uint8)
        for r in range(m):
            codes = [_e5m6_bits(v) for v in q[r].tolist()]
            for g in range(n // 8):
                value = 0
                for c in codes[8 * g : 8 * g + 8]:
                    value = (value << 12) | c
                raw = value.to_bytes(12, "big")  # w0 w1 w2, each big-endian here
                words = [raw[0:4], raw[4:8], raw[8:12]]
                data[r, 12 * g : 12 * g + 12] = torch.tensor(list(b"".join(w[::-1] for w in words)), dtype=torch.uint8)
        return data, scales.double()
    codes = torch.tensor([_e2m1_bits(v) for v in q.flatten().tolist()], dtype=torch.uint8).view(m, n)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous(), scales.double()


def quantize_blocks_bad_inputs(device) -> list[BadInput]:
    x = torch.randn(4, 64)
    return [
        BadInput((x, "e5m7", [1, 32], False, None, None), r"argument 'fmt' value: expected 'e4m3', 'e2m1' or", "fmt"),
        BadInput((x, "e5m6", [2, 32], False, None, None), r"argument 'block' value: expected \[1, cols\] for", "e5m6"),
        BadInput((x[:, :60], "e5m6", [1, 32], False, None, None), r"'x' size\(1\): expected a multiple of 8", "x8"),
        BadInput((x[:, :63], "e2m1", [1, 32], False, None, None), r"argument 'x' size\(1\): expected an even", "odd"),
        BadInput((x, "e4m3", [0, 32], False, None, None), r"argument 'block' value", "block"),
        BadInput((x.int(), "e4m3", [1, 32], False, None, None), r"argument 'x' dtype", "dtype"),
        BadInput(
            (x, "e4m3", [1, 32], False, torch.ones(4, 3), None), r"argument 'sf' shape: expected \[4, 2\]", "sf shape"
        ),
        BadInput((x, "e4m3", [1, 32], False, torch.ones(4, 2).double(), None), r"argument 'sf' dtype", "sf dtype"),
        BadInput(
            (x, "e4m3", [1, 32], False, None, 0.0), r"argument 'amax_clamp' value: expected None or a positive", "clamp"
        ),
    ]


_NO_GRADIENT = "codes carry no gradient: the outputs are non-differentiable (tests/quant/test_quant_ops.py checks it)"

SPECS = [
    OpSpec(
        "quantize_fp8",
        _quantize_samples(fp4=False),
        quantize_fp8_reference,
        _quantize_bad_inputs(fp4=False),
        portable.quantize_fp8,
        gradcheck=_NO_GRADIENT,
    ),
    OpSpec(
        "quantize_fp4",
        _quantize_samples(fp4=True),
        quantize_fp4_reference,
        _quantize_bad_inputs(fp4=True),
        portable.quantize_fp4,
        gradcheck=_NO_GRADIENT,
    ),
    OpSpec(
        "quantize_blocks",
        quantize_blocks_samples,
        quantize_blocks_reference,
        quantize_blocks_bad_inputs,
        portable.quantize_blocks,
        dtypes=(torch.bfloat16, torch.float32),
        gradcheck=_NO_GRADIENT,
        aoti="a Python kernel (device-generic torch ops): no C++ kernel for an AOTInductor package to call",
    ),
    OpSpec(
        "dequantize",
        dequantize_samples,
        dequantize_reference,
        dequantize_bad_inputs,
        portable.dequantize,
        gradcheck="only the FP32 scale is differentiable, with no float64 path; its gradient is checked against fp64 "
        "block sums in tests/quant/test_quant_ops.py",
    ),
]
