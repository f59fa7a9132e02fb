"""The math of the stand-in: TileKernels' own PyTorch references (``tile_kernels/torch/cast.py`` and ``swiglu.py`` @
36d9e45, which upstream's tests find bitwise equal to the kernels on finite inputs) and, where the kernels compute
differently, a model of the kernel (``kernel_*``), read from ``quant/common.py`` @ 36d9e45.

The one modelled difference: a kernel takes its block amax with CUDA's ``max`` (``fmaxf``: a NaN loses to any number;
``T.reduce_absmax``, then ``T.max(amax, clamp_min_value)`` in ``get_sf_and_inv``), and rounds a scale up to a power
of two with ``exp_sf = ((bits - 1) >> 23) + 1 - 127``, ``sf_inv = reinterpret((127 - exp_sf) << 23)``, which for an
infinite amax (``exp_sf = 128``) is the bit pattern of -inf. The reference (NaN-propagating ``torch.max``, ``1.0 /
sf``) gives such blocks a NaN or 0 scale instead. [inferred: CUDA codegen of TileLang's float max is ``fmaxf``; the
tests only draw ``randn``.] The E4M3 conversion saturates (``satfinite``: +-inf -> +-448, NaN stays NaN); the E2M1
one is the reference's bit rounding (its NaN code is the reference's, 7 with NaN's sign bit: the hardware's is
unknown).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

MAX = {"e4m3": 448.0, "e2m1": 6.0}
CLAMP_MIN = {"e4m3": 1e-4, "e2m1": 6.0 * 2.0**-126}  # quant/common.py CastOutputConfig.clamp_min_value


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def blocks(x: torch.Tensor, block) -> tuple[torch.Tensor, torch.Tensor]:
    """FP32 ``x`` zero-padded to whole blocks as ``[rows, bh, cols, bw]``, and which entries are real."""
    h, w = x.shape
    bh, bw = block
    pad = (0, (-w) % bw, 0, (-h) % bh)
    padded = F.pad(x.float(), pad)
    valid = F.pad(torch.ones_like(x, dtype=torch.bool), pad)
    shape = (padded.shape[0] // bh, bh, padded.shape[1] // bw, bw)
    return padded.view(shape), valid.view(shape)


def e2m1_codes(q: torch.Tensor) -> torch.Tensor:
    """``convert_to_e2m1_bits``: FP32 -> 4-bit E2M1 codes (uint8), round to nearest even on the bits, saturating at 6
    (code 7); subnormal inputs keep a sticky bit."""
    bits = q.contiguous().view(torch.int32).long() & 0xFFFFFFFF
    sign = (bits >> 31) & 1
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    subnormal = exponent < 127
    shift = (127 - exponent - 1).clamp(min=0, max=31)
    pre = 0x400000 | (mantissa >> 1)
    sticky = subnormal & (((mantissa & 1) != 0) | ((pre & ((1 << shift) - 1)) != 0))
    mantissa = torch.where(subnormal, pre >> shift, mantissa)
    exponent = torch.clamp(exponent, min=126) - 126
    m2 = (mantissa >> 21) & 0x3
    keep, guard = (m2 >> 1) & 1, m2 & 1
    sticky = sticky | ((mantissa & ((1 << 21) - 1)) != 0)
    code = ((((exponent << 2) | m2) + (guard & (sticky.long() | keep))) >> 1).clamp(max=7)
    return ((sign << 3) | code).to(torch.uint8)


def encode(q: torch.Tensor, fmt: str) -> torch.Tensor:
    """Scaled FP32 values as codes: E4M3 ``[h, w]`` (clamped to +-448 first), or E2M1 packed two per byte (column
    2j in the low nibble) as int8 ``[h, w / 2]``, upstream's FP4 dtype."""
    if fmt == "e4m3":
        return torch.clamp(q, -448.0, 448.0).to(torch.float8_e4m3fn)
    codes = e2m1_codes(q)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).view(torch.int8)


def cast(x: torch.Tensor, fmt: str, block, sf: torch.Tensor | None = None, round_sf: bool = False):
    """``tile_kernels.torch.cast`` for a plain tensor, row-major FP32 scales: ``(data, sf)`` or the data alone with a
    given ``sf``."""
    h, w = x.shape
    padded, valid = blocks(x, block)
    if sf is None:
        amax = torch.where(valid, padded.abs(), -1.0).amax(dim=(1, 3))
        amax = torch.clamp(amax, min=CLAMP_MIN[fmt])
        limit = torch.full_like(amax, MAX[fmt])  # a tensor division, as upstream's (no reciprocal)
        scale = amax / limit
        if round_sf:
            scale = ((scale.view(torch.int32) + 0x007FFFFF) & 0x7F800000).view(torch.float32)
            multiplier = torch.where(scale == 0, 0.0, 1.0 / scale)
        else:
            multiplier = torch.where(scale.view(torch.int32) == 0, 0.0, limit / amax)
    else:
        scale, multiplier = None, sf.reciprocal()
    q = (padded * multiplier[:, None, :, None]).reshape(padded.shape[0] * padded.shape[1], -1)[:h, :w]
    data = encode(q, fmt)
    return data if scale is None else (data, scale)


def kernel_sf_and_inv(amax: torch.Tensor, fmt: str, round_sf: bool, clamp_min: float | None = None):
    """``get_sf_and_inv``: the FP32 scale and the multiplier of an amax (``fmaxf`` against the floor)."""
    floor = torch.tensor(CLAMP_MIN[fmt] if clamp_min is None else clamp_min, dtype=torch.float32)
    clamped = torch.fmax(amax, floor)
    limit = torch.full_like(clamped, MAX[fmt])
    scale = clamped / limit
    if not round_sf:
        return scale, limit / clamped
    bits = scale.view(torch.int32).long() & 0xFFFFFFFF
    exp_sf = ((bits - 1) >> 23) + 1 - 127
    as_float = lambda b: (b & 0xFFFFFFFF).to(torch.int64).to(torch.int32).view(torch.float32)  # noqa: E731
    # ``(127 - exp_sf) << 23`` as int32 (wrapping)
    wrap = lambda v: ((v << 23) + 2**31) % 2**32 - 2**31  # noqa: E731
    return as_float(wrap(127 + exp_sf)), as_float(wrap(127 - exp_sf))


def kernel_amax(values: torch.Tensor, valid: torch.Tensor | None = None, dims=(1, 3)) -> torch.Tensor:
    """A block's amax as the kernel takes it: NaN loses (``fmaxf``), from 0."""
    a = values.abs()
    a = torch.where(torch.isnan(a), 0.0, a)
    if valid is not None:
        a = torch.where(valid, a, 0.0)
    return a.amax(dim=dims)


def kernel_cast(x: torch.Tensor, fmt: str, block, round_sf: bool, sf: torch.Tensor | None = None,
                clamp_min: float | None = None):  # fmt: skip
    """A cast kernel on FP32 values: ``(data, sf)``, or the data alone with a given ``sf`` (multiplier ``1 / sf``)."""
    h, w = x.shape
    padded, valid = blocks(x, block)
    if sf is None:
        scale, multiplier = kernel_sf_and_inv(kernel_amax(padded, valid), fmt, round_sf, clamp_min)
    else:
        scale, multiplier = None, sf.reciprocal()
    q = (padded * multiplier[:, None, :, None]).reshape(padded.shape[0] * padded.shape[1], -1)[:h, :w]
    data = encode(q, fmt)
    return data if scale is None else (data, scale)


def swiglu_forward(x, pos_to_token_topk=None, topk_weights=None, swiglu_clamp_value=None, clamped_count=None):
    """``tile_kernels.torch.swiglu_forward``: FP32 ``a / (1 + exp(-a)) * b``, clamped and weighted per row."""
    hidden = x.shape[1] // 2
    xf = x.float()
    a, b = xf[:, :hidden], xf[:, hidden:]
    if swiglu_clamp_value is not None:
        c = swiglu_clamp_value
        if clamped_count is not None:
            clamped_count[0] += (a > c).sum()
            clamped_count[1] += (b > c).sum()
            clamped_count[2] += (b < -c).sum()
        a, b = torch.clamp(a, max=c), torch.clamp(b, min=-c, max=c)
    out = a / (1.0 + torch.exp(-a)) * b
    if pos_to_token_topk is not None:
        k = topk_weights.shape[1]
        valid = pos_to_token_topk >= 0
        p = pos_to_token_topk.long().clamp(min=0)
        w = torch.where(valid, topk_weights.float().reshape(-1)[p], 0.0)
        out = out * w[:, None]
        del k
    return out
