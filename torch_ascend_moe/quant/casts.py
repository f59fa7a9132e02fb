"""DeepGEMM's reference quantizers (``deep_gemm.utils.math``), bit-for-bit, plus their inverses.

Every cast computes ``amax`` per group in FP32, floors it at 1e-4, divides by the format maximum (448 for
E4M3, 6 for E2M1) to get the scale, optionally rounds the scale up to a power of two (UE8M0), and
multiplies by the scale's reciprocal before rounding to the low-precision format. Groups that run past
the tensor are zero-padded, which never raises ``amax``. A NaN in a group makes its ``amax`` and so its
scale NaN (UE8M0 code 255 when rounded), and the whole group dequantizes to NaN.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from torch_ascend_moe import _checks as ck
from torch_ascend_moe.quant.encodings import (
    FP4_MAX,
    FP8_MAX,
    ceil_to_ue8m0,
    decode_e2m1,
    encode_e2m1,
    pack_e2m1,
    pack_ue8m0_to_int,
    unpack_e2m1,
    unpack_ue8m0_from_int,
)

_AMAX_FLOOR = 1e-4


def _scale(amax: torch.Tensor, fmt_max: float, use_ue8m0: bool) -> torch.Tensor:
    sf = amax.clamp(min=_AMAX_FLOOR) / fmt_max
    return ceil_to_ue8m0(sf) if use_ue8m0 else sf


def _check_2d(api: str, x: torch.Tensor) -> None:
    ck.check_rank(api, "x", x, 2, "[m, n]")


def _pad_last(x: torch.Tensor, multiple: int) -> torch.Tensor:
    return F.pad(x, (0, (-x.shape[-1]) % multiple))


def block_cast_to_fp8(x: torch.Tensor, block: Sequence[int], use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``block = (rows, cols)`` blocks: ``x[m, n]`` -> (E4M3 ``[m, n]``, ``sf[ceil(m/rows), ceil(n/cols)]``).

    The one cast behind per-token ``(1, g)``, per-channel ``(g, 1)`` and per-block ``(g, g)`` scaling,
    and the C++ quantizer of the ``fp8_linear`` ops computes the same bits.

    >>> q, sf = block_cast_to_fp8(torch.randn(4, 256), (1, 128), use_ue8m0=True)
    >>> q.dtype, sf.shape
    (torch.float8_e4m3fn, torch.Size([4, 2]))
    """
    api = "block_cast_to_fp8"
    _check_2d(api, x)
    ck.check_arg(
        len(block) == 2 and block[0] > 0 and block[1] > 0, api, "block", "value", "(rows, cols), positive", block
    )
    (m, n), (gr, gc) = x.shape, block
    padded = F.pad(x.float(), (0, (-n) % gc, 0, (-m) % gr))
    blocks = padded.view(padded.shape[0] // gr, gr, padded.shape[1] // gc, gc)
    sf = _scale(blocks.abs().amax(dim=(1, 3)), FP8_MAX, use_ue8m0)
    q = (blocks * (1.0 / sf)[:, None, :, None]).to(torch.float8_e4m3fn).view_as(padded)
    return q[:m, :n].contiguous(), sf


def per_token_cast_to_fp8(
    x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row groups of ``gran_k``: ``x[m, n]`` -> (E4M3 ``[m, n]``, FP32 scales ``[m, ceil(n/gran_k)]``).

    ``use_packed_ue8m0`` returns the scales as int32 ``[m, ceil(n/gran_k)/4]`` (needs ``use_ue8m0`` and a
    scale count that is a multiple of 4).

    >>> q, sf = per_token_cast_to_fp8(torch.randn(4, 256), use_ue8m0=True)
    >>> q.dtype, sf.shape
    (torch.float8_e4m3fn, torch.Size([4, 2]))
    """
    api = "per_token_cast_to_fp8"
    _check_2d(api, x)
    ck.check_arg(not use_packed_ue8m0 or use_ue8m0, api, "use_packed_ue8m0", "value", "False unless use_ue8m0", True)
    q, sf = block_cast_to_fp8(x, (1, gran_k), use_ue8m0)
    return q, pack_ue8m0_to_int(sf) if use_packed_ue8m0 else sf


def per_channel_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-column groups of ``gran_k`` rows: ``x[m, n]`` (``m % gran_k == 0``) -> (E4M3, ``sf[m/gran_k, n]``)."""
    api = "per_channel_cast_to_fp8"
    _check_2d(api, x)
    ck.check_arg(x.shape[0] % gran_k == 0, api, "x", "size(0)", f"a multiple of gran_k={gran_k}", x.shape[0])
    return block_cast_to_fp8(x, (gran_k, 1), use_ue8m0)


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """``gran_k x gran_k`` blocks: ``x[m, n]`` -> (E4M3 ``[m, n]``, ``sf[ceil(m/gran_k), ceil(n/gran_k)]``)."""
    _check_2d("per_block_cast_to_fp8", x)
    return block_cast_to_fp8(x, (gran_k, gran_k), use_ue8m0)


def per_custom_dims_cast_to_fp8(
    x: torch.Tensor, dims: Sequence[int], use_ue8m0: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per index of ``dims`` (amax over every other dim); the scale has the shape of ``dims``.

    ``dims=(0,)`` on ``[S, D]`` KV rows gives the per-token KV scales of the MQA indexer.
    """
    api = "per_custom_dims_cast_to_fp8"
    kept = sorted(d % x.dim() for d in dims)
    ck.check_arg(len(set(kept)) == len(kept) and len(kept) > 0, api, "dims", "value", "distinct dims", tuple(dims))
    reduced = [d for d in range(x.dim()) if d not in kept]
    xf = x.float()
    amax = xf.abs().amax(dim=reduced, keepdim=True) if reduced else xf.abs()
    sf = _scale(amax, FP8_MAX, use_ue8m0)
    q = (xf * (1.0 / sf)).to(torch.float8_e4m3fn)
    return q, sf.squeeze(reduced) if reduced else sf


def dequantize_fp8(q: torch.Tensor, sf: torch.Tensor, gran_mn: int, gran_k: int) -> torch.Tensor:
    """FP32 ``q[mn, k] * sf[mn // gran_mn, k // gran_k]``: the dequantization contract of every scaled GEMM."""
    mn, k = q.shape
    full = sf.float().repeat_interleave(gran_mn, dim=0)[:mn].repeat_interleave(gran_k, dim=1)[:, :k]
    return q.float() * full


def per_token_cast_to_fp4(
    x: torch.Tensor, use_ue8m0: bool, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row groups of ``gran_k`` to E2M1: ``x[m, n]`` (n even) -> (int8 ``[m, n/2]``, scales).

    Scales are FP32 ``[m, ceil(n/gran_k)]``, or with ``use_packed_ue8m0`` (needs ``use_ue8m0``) int32
    ``[m, ceil(ceil(n/gran_k)/4)]``, the count padded to a multiple of 4 with 1.0.
    """
    api = "per_token_cast_to_fp4"
    _check_2d(api, x)
    m, n = x.shape
    ck.check_arg(n % 2 == 0, api, "x", "size(1)", "an even number (two E2M1 codes per byte)", n)
    ck.check_arg(not use_packed_ue8m0 or use_ue8m0, api, "use_packed_ue8m0", "value", "False unless use_ue8m0", True)
    groups = _pad_last(x.float(), gran_k).view(m, -(-n // gran_k), gran_k)
    sf = _scale(groups.abs().amax(dim=-1), FP4_MAX, use_ue8m0)
    codes = encode_e2m1(groups * (1.0 / sf).unsqueeze(-1)).view(m, -(-n // gran_k) * gran_k)[:, :n]
    packed = pack_e2m1(codes).view(torch.int8)
    if use_packed_ue8m0:
        sf = pack_ue8m0_to_int(F.pad(sf, (0, (-sf.shape[-1]) % 4), value=1.0))
    return packed, sf


def cast_back_from_fp4(
    packed: torch.Tensor, sf: torch.Tensor, gran_k: int = 128, use_packed_ue8m0: bool = False
) -> torch.Tensor:
    """Dequantize ``per_token_cast_to_fp4``'s output to FP32 ``[m, n]``."""
    values = decode_e2m1(unpack_e2m1(packed))
    scales = unpack_ue8m0_from_int(sf) if use_packed_ue8m0 else sf.float()
    n = values.shape[-1]
    return values * scales.repeat_interleave(gran_k, dim=-1)[..., :n]


def transpose_packed_fp4(a: torch.Tensor) -> torch.Tensor:
    """Transpose packed FP4: int8 ``[m, n/2]`` -> int8 ``[n, m/2]`` (``m`` even); codes are moved, not re-rounded."""
    api = "transpose_packed_fp4"
    ck.check_rank(api, "a", a, 2, "[m, n/2]")
    ck.check_arg(a.shape[0] % 2 == 0, api, "a", "size(0)", "an even number of rows", a.shape[0])
    return pack_e2m1(unpack_e2m1(a).t()).view(torch.int8)
