"""DeepGEMM's reference quantizers (``deep_gemm.utils.math``), bit-for-bit, plus their inverses: upstream's
signatures and outputs on the quant family's ops (``torch.ops.ascend_moe.quantize_fp8`` / ``quantize_fp4`` /
``dequantize``), whose kernels hold the math (C++ on CPU, ``quant.reference`` everywhere else).

Every cast computes ``amax`` per group in FP32, floors it at 1e-4, divides by the format maximum (448 for
E4M3, 6 for E2M1) to get the scale, optionally rounds the scale up to a power of two (UE8M0), and
multiplies by the scale's reciprocal before rounding to the low-precision format. Groups that run past
the tensor are zero-padded, which never raises ``amax``. A NaN in a group makes its ``amax`` and so its
scale NaN (UE8M0 code 255 when rounded), and the whole group dequantizes to NaN. The outputs carry no
gradient (``quant.fake_quantize`` is the straight-through path).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.ops.quant import dequantize, quantize_fp4, quantize_fp8
from torch_ascend_moe.quant.encodings import pack_e2m1, pack_ue8m0_to_int, unpack_e2m1, unpack_ue8m0_from_int


def _check_2d(api: str, x: torch.Tensor) -> None:
    ck.check_rank(api, "x", x, 2, "[m, n]")


def block_cast_to_fp8(x: torch.Tensor, block: Sequence[int], use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``block = (rows, cols)`` blocks: ``x[m, n]`` -> (E4M3 ``[m, n]``, ``sf[ceil(m/rows), ceil(n/cols)]``).

    The one cast behind per-token ``(1, g)``, per-channel ``(g, 1)`` and per-block ``(g, g)`` scaling:
    ``torch.ops.ascend_moe.quantize_fp8``, whose casts the ``fp8_linear`` ops share.

    >>> q, sf = block_cast_to_fp8(torch.randn(4, 256), (1, 128), use_ue8m0=True)
    >>> q.dtype, sf.shape
    (torch.float8_e4m3fn, torch.Size([4, 2]))
    """
    api = "block_cast_to_fp8"
    _check_2d(api, x)
    ck.check_arg(
        len(block) == 2 and block[0] > 0 and block[1] > 0, api, "block", "value", "(rows, cols), positive", block
    )
    return quantize_fp8(x, block, use_ue8m0=use_ue8m0)


def per_token_cast_to_fp8(
    x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row groups of ``gran_k``: ``x[m, n]`` -> (E4M3 ``[m, n]``, FP32 scales ``[m, ceil(n/gran_k)]``).

    ``use_packed_ue8m0`` returns the scales as int32 ``[m, ceil(ceil(n/gran_k)/4)]`` (needs ``use_ue8m0``); a count
    that is not a multiple of 4 is padded with 1.0, as DeepGEMM 2.8 does (2.6.1 asserted).

    >>> q, sf = per_token_cast_to_fp8(torch.randn(4, 256), use_ue8m0=True)
    >>> q.dtype, sf.shape
    (torch.float8_e4m3fn, torch.Size([4, 2]))
    """
    api = "per_token_cast_to_fp8"
    _check_2d(api, x)
    ck.check_int_arg(api, "gran_k", gran_k, 1)  # before any arithmetic: 0 would divide by zero
    ck.check_arg(not use_packed_ue8m0 or use_ue8m0, api, "use_packed_ue8m0", "value", "False unless use_ue8m0", True)
    count = -(-x.shape[1] // gran_k)
    if use_packed_ue8m0 and count % 4:
        q, sf = quantize_fp8(x, (1, gran_k), use_ue8m0=True)
        return q, pack_ue8m0_to_int(torch.nn.functional.pad(sf, (0, 4 - count % 4), value=1.0))
    return quantize_fp8(x, (1, gran_k), use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0)


def per_channel_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-column groups of ``gran_k`` rows: ``x[m, n]`` (``m % gran_k == 0``) -> (E4M3, ``sf[m/gran_k, n]``)."""
    api = "per_channel_cast_to_fp8"
    _check_2d(api, x)
    ck.check_int_arg(api, "gran_k", gran_k, 1)
    ck.check_arg(x.shape[0] % gran_k == 0, api, "x", "size(0)", f"a multiple of gran_k={gran_k}", x.shape[0])
    return quantize_fp8(x, (gran_k, 1), use_ue8m0=use_ue8m0)


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``gran_k x gran_k`` blocks: ``x[m, n]`` -> (E4M3 ``[m, n]``, ``sf[ceil(m/gran_k), ceil(n/gran_k)]``)."""
    _check_2d("per_block_cast_to_fp8", x)
    return quantize_fp8(x, (gran_k, gran_k), use_ue8m0=use_ue8m0)


def per_custom_dims_cast_to_fp8(
    x: torch.Tensor, dims: Sequence[int], use_ue8m0: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per index of ``dims`` (amax over every other dim); the scale has the shape of ``dims``, size-1
    dims squeezed out as upstream's ``sf.squeeze()`` does.

    ``dims=(0,)`` on ``[S, D]`` KV rows gives the per-token KV scales of the MQA indexer.
    """
    api = "per_custom_dims_cast_to_fp8"
    kept = sorted(d % x.dim() for d in dims)
    ck.check_arg(len(set(kept)) == len(kept) and len(kept) > 0, api, "dims", "value", "distinct dims", tuple(dims))
    reduced = [d for d in range(x.dim()) if d not in kept]
    # Kept dims first, each index one row: the scale is the row's per-token scale.
    rows = x.permute(*kept, *reduced)
    width = math.prod(rows.shape[len(kept) :])
    q, sf = quantize_fp8(rows.reshape(-1, width), (1, width), use_ue8m0=use_ue8m0)
    inverse = [0] * x.dim()
    for i, d in enumerate([*kept, *reduced]):
        inverse[d] = i
    # Upstream returns its keepdim scales squeezed: size-1 kept dims go too (one token's scale is 0-D).
    return q.view(rows.shape).permute(*inverse).contiguous(), sf.view([x.shape[d] for d in kept]).squeeze()


def dequantize_fp8(q: torch.Tensor, sf: torch.Tensor, gran_mn: int, gran_k: int) -> torch.Tensor:
    """FP32 ``q[mn, k] * sf[mn // gran_mn, k // gran_k]``: the dequantization contract of every scaled GEMM."""
    ck.check_int_arg("dequantize_fp8", "gran_mn", gran_mn, 1)
    ck.check_int_arg("dequantize_fp8", "gran_k", gran_k, 1)
    mn, k = q.shape
    # Scales past the data (a larger, e.g. unpacked, scale tensor) are ignored, as upstream's slicing does.
    sf = sf[: -(-mn // gran_mn), : -(-k // gran_k)]
    return dequantize(q, sf if sf.dtype == torch.float8_e8m0fnu else sf.float(), (gran_mn, gran_k))


def per_token_cast_to_fp4(
    x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row groups of ``gran_k`` to E2M1: ``x[m, n]`` (n even) -> (int8 ``[m, n/2]``, scales).

    Scales are FP32 ``[m, ceil(n/gran_k)]``, or with ``use_packed_ue8m0`` (needs ``use_ue8m0``) int32
    ``[m, ceil(ceil(n/gran_k)/4)]``, the count padded to a multiple of 4 with 1.0.
    """
    api = "per_token_cast_to_fp4"
    _check_2d(api, x)
    n = x.shape[1]
    ck.check_arg(n % 2 == 0, api, "x", "size(1)", "an even number (two E2M1 codes per byte)", n)
    ck.check_arg(not use_packed_ue8m0 or use_ue8m0, api, "use_packed_ue8m0", "value", "False unless use_ue8m0", True)
    packed, sf = quantize_fp4(x, (1, gran_k), use_ue8m0=use_ue8m0, use_packed_ue8m0=use_packed_ue8m0)
    return packed.view(torch.int8), sf


def cast_back_from_fp4(
    packed: torch.Tensor, sf: torch.Tensor, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> torch.Tensor:
    """Dequantize ``per_token_cast_to_fp4``'s output (int8, uint8 or ``float4_e2m1fn_x2`` ``[..., n/2]``) to FP32
    ``[..., n]``; ``sf`` is FP32 ``[..., ceil(n/gran_k)]`` or, with ``use_packed_ue8m0``, packed int32."""
    ck.check_int_arg("cast_back_from_fp4", "gran_k", gran_k, 1)
    if use_packed_ue8m0:
        ck.check_arg(sf.dtype == torch.int32, "cast_back_from_fp4", "sf", "dtype", torch.int32, sf.dtype)
    n = 2 * packed.shape[-1]
    count = -(-n // gran_k)
    # Scales past the data (the packed count's padding) are ignored, as upstream's slicing does.
    scales = sf[..., : -(-count // 4)] if use_packed_ue8m0 else sf[..., :count].float()
    rows = packed.reshape(-1, packed.shape[-1]).view(torch.uint8)
    out = dequantize(rows, scales.reshape(-1, scales.shape[-1]), (1, gran_k))
    return out.view(*packed.shape[:-1], n)


def cast_back_from_fp8(
    x_fp8: torch.Tensor, sf: torch.Tensor, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> torch.Tensor:
    """Dequantize ``per_token_cast_to_fp8``'s output (E4M3 ``[..., n]``) to FP32: ``out[m, j] = float(x[m, j]) ·
    sf[m, j // gran_k]``; ``sf`` is FP32 ``[..., ceil(n/gran_k)]`` or, with ``use_packed_ue8m0``, packed int32 (DeepGEMM
    2.8's ``deep_gemm.utils.math.cast_back_from_fp8``)."""
    api = "cast_back_from_fp8"
    ck.check_arg(x_fp8.dtype == torch.float8_e4m3fn, api, "x_fp8", "dtype", torch.float8_e4m3fn, x_fp8.dtype)
    if use_packed_ue8m0:
        ck.check_arg(sf.dtype == torch.int32, api, "sf", "dtype", torch.int32, sf.dtype)
    n = x_fp8.shape[-1]
    scales = unpack_ue8m0_from_int(sf) if use_packed_ue8m0 else sf
    out = dequantize_fp8(x_fp8.reshape(-1, n), scales.reshape(-1, scales.shape[-1]), 1, gran_k)
    return out.view(*x_fp8.shape[:-1], n)


def transpose_packed_fp4(a: torch.Tensor) -> torch.Tensor:
    """Transpose packed FP4: int8 ``[m, n/2]`` -> int8 ``[n, m/2]`` (``m`` even); codes are moved, not re-rounded."""
    api = "transpose_packed_fp4"
    ck.check_rank(api, "a", a, 2, "[m, n/2]")
    ck.check_arg(a.shape[0] % 2 == 0, api, "a", "size(0)", "an even number of rows", a.shape[0])
    return pack_e2m1(unpack_e2m1(a).t()).view(torch.int8)
