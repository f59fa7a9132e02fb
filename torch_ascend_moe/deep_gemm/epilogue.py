"""DeepGEMM-Ascend's GEMM epilogues (``deep_gemm.epilogue``).

``Identity()`` leaves ``D = A @ B^T (+ C)``; ``Alpha(alpha)`` scales the product; ``FP8Quantization(sfd)``
(scaled GEMMs) writes an FP8 E4M3 ``D`` with per-row block scales into ``sfd``.

FP8 output semantics (DeepGEMM-Ascend names the epilogue but publishes no formula; this follows its
own quantizers, specs/deepgemm_api.md §12): the FP32 result is cast per row in ``1 x g`` blocks along N,
``sfd = max(amax, 1e-4) / 448`` and ``D = e4m3(result / sfd)``, so ``D * sfd`` dequantizes it. ``g`` is
read from ``sfd``'s shape (32 or 128: ``sfd.size(-1) == ceil(N / g)`` scales, packed 2 per int16 or 4 per
int32 along N for UE8M0). FP32 ``sfd`` holds exact scales; ``float8_e8m0fnu`` and packed ones hold
power-of-two scales (rounded up, as ``use_ue8m0``).
"""

from __future__ import annotations

import dataclasses

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.deep_gemm.utils.math import ceil_div
from torch_ascend_moe.quant import per_token_cast_to_fp8
from torch_ascend_moe.quant.encodings import pack_ue8m0_to_int, pack_ue8m0_to_int16


@dataclasses.dataclass(frozen=True)
class Identity:
    """No epilogue: ``D = A @ B^T (+ C)``."""


@dataclasses.dataclass(frozen=True)
class Alpha:
    """``D = alpha * A @ B^T (+ C)``."""

    alpha: float


@dataclasses.dataclass(frozen=True, eq=False)
class FP8Quantization:
    """FP8 E4M3 output: ``D`` gets the codes, ``sfd`` (``[..., M, ceil(N / g)]``, g in {32, 128}) the scales."""

    sfd: torch.Tensor


def resolve_alpha(api: str, alpha: float | None, epilogue: object | None, fp8_output: bool = False) -> float:
    """The scale a call asks for through ``alpha=`` or an epilogue (not both)."""
    allowed = (Identity, Alpha, FP8Quantization) if fp8_output else (Identity, Alpha)
    if epilogue is not None and not isinstance(epilogue, allowed):
        names = "Identity(), Alpha(alpha) or FP8Quantization(sfd)" if fp8_output else "Identity() or Alpha(alpha)"
        raise TypeError(f"{api}: argument 'epilogue': expected None, {names}, got {epilogue!r}")
    if isinstance(epilogue, Alpha):
        if alpha is not None:
            raise ValueError(f"{api}: argument 'alpha': expected None when epilogue=Alpha(...) is given, got {alpha}")
        return float(epilogue.alpha)
    return 1.0 if alpha is None else float(alpha)


_PACKED = {torch.int32: 4, torch.int16: 2}


def fp8_output_scales(api: str, d: torch.Tensor, sfd: torch.Tensor) -> tuple[int, bool]:
    """Checks an FP8 ``d`` and its ``sfd``; returns (the block g along N, whether scales are UE8M0)."""
    ck.check_arg(d.dtype == torch.float8_e4m3fn, api, "d", "dtype", "torch.float8_e4m3fn (FP8 output)", d.dtype)
    allowed = (torch.float32, torch.float8_e8m0fnu, torch.int32, torch.int16)
    ck.check_arg(sfd.dtype in allowed, api, "sfd", "dtype", "torch.float32, float8_e8m0fnu, int32 or int16", sfd.dtype)
    n, per = d.shape[-1], _PACKED.get(sfd.dtype, 1)
    grans = [g for g in (128, 32) if ceil_div(ceil_div(n, g), per) == sfd.shape[-1]]
    expected = f"{list(d.shape[:-1])} + [ceil(ceil(N / g) / {per})] for g = 32 or 128 (N = {n})"
    ok = bool(grans) and list(sfd.shape[:-1]) == list(d.shape[:-1])
    ck.check_arg(ok, api, "sfd", "shape", expected, lambda: list(sfd.shape))
    return grans[0], sfd.dtype != torch.float32


def write_fp8_output(api: str, result: torch.Tensor, d: torch.Tensor, sfd: torch.Tensor) -> None:
    """Quantize the FP32 ``result`` into ``d`` (E4M3) and ``sfd`` per the FP8Quantization contract."""
    gran, ue8m0 = fp8_output_scales(api, d, sfd)
    n = result.shape[-1]
    q, sf = per_token_cast_to_fp8(result.reshape(-1, n), use_ue8m0=ue8m0, gran_k=gran)
    d.copy_(q.view(d.shape))
    sf = sf.view(*d.shape[:-1], sf.shape[-1])
    if sfd.dtype in _PACKED:
        sf = torch.nn.functional.pad(sf, (0, (-sf.shape[-1]) % _PACKED[sfd.dtype]))
        sf = (pack_ue8m0_to_int if sfd.dtype == torch.int32 else pack_ue8m0_to_int16)(sf)
    sfd.copy_(sf)
