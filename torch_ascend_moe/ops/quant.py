"""The quant family: FP8 E4M3 and FP4 E2M1 block quantization with FP32 or UE8M0 scales, and its inverse.

DeepGEMM's reference quantizers (``deep_gemm.utils.math``) bit for bit, as ops: one ``block = [rows, cols]``
covers per-token ``[1, g]``, per-channel ``[g, 1]`` and per-block ``[g, g]`` scaling. Per block the scale is
``max(amax, 1e-4) / 448`` (E4M3) or ``/ 6`` (E2M1), rounded up to a power of two with ``use_ue8m0``; blocks past
the edge are zero-padded; a NaN in a block makes its scale NaN, so the block dequantizes to NaN.

Gradients: FP8 and FP4 data are codes and carry no gradient (autograd keeps a gradient in its tensor's dtype: an
FP8 gradient has 3 mantissa bits and flushes below 2^-9, so realistic gradients would silently become 0; FP4 codes
are integers). The quantize ops' outputs are therefore not differentiable, and ``dequantize`` differentiates only
an FP32 ``scale``. Training that must see quantized values uses ``torch_ascend_moe.quant.fake_quantize``
(``dequantize(quantize(x))`` with the identity gradient, a straight-through estimator in high precision) or the ops
that cast inside (``fp8_linear``, ``fp8_quant_gemm``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_quantize_fp8 = torch.ops.ascend_moe.quantize_fp8.default
_quantize_fp4 = torch.ops.ascend_moe.quantize_fp4.default
_dequantize = torch.ops.ascend_moe.dequantize.default
_quantize_blocks = torch.ops.ascend_moe.quantize_blocks.default


@schema_defaults
def quantize_fp8(
    x: torch.Tensor,
    block: Sequence[int] = FROM_SCHEMA,
    *,
    use_ue8m0: bool = FROM_SCHEMA,
    use_packed_ue8m0: bool = FROM_SCHEMA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, N]`` (BF16/FP16/FP32/FP64) in ``block = (rows, cols)`` blocks -> (E4M3 ``[M, N]``, scales).

    Scales are FP32 ``[ceil(M/rows), ceil(N/cols)]``; with ``use_packed_ue8m0`` (needs ``use_ue8m0``) int32
    ``[ceil(M/rows), ceil(ceil(N/cols)/4)]``, four UE8M0 codes per word along the last dim, a ragged count padded
    with 1.0. Not differentiable (see the module docstring).

    >>> q, sf = quantize_fp8(torch.randn(4, 256), (1, 128), use_ue8m0=True)
    >>> q.dtype, sf.shape
    (torch.float8_e4m3fn, torch.Size([4, 2]))
    """
    return _quantize_fp8(x, list(block), use_ue8m0, use_packed_ue8m0)


@schema_defaults
def quantize_fp4(
    x: torch.Tensor,
    block: Sequence[int] = FROM_SCHEMA,
    *,
    use_ue8m0: bool = FROM_SCHEMA,
    use_packed_ue8m0: bool = FROM_SCHEMA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [M, N]`` (N even) in ``block`` blocks to E2M1 -> (uint8 ``[M, N/2]``, scales as ``quantize_fp8``).

    Byte ``j`` of a row holds element ``2j`` in its low nibble and ``2j + 1`` in its high nibble; rounding is
    DeepGEMM's (ties to the smaller magnitude: 0.75 -> 0.5, 2.5 -> 2). Not differentiable.

    >>> data, sf = quantize_fp4(torch.randn(4, 64), (1, 32), use_ue8m0=True)
    >>> data.dtype, data.shape, sf.shape
    (torch.uint8, torch.Size([4, 32]), torch.Size([4, 2]))
    """
    return _quantize_fp4(x, list(block), use_ue8m0, use_packed_ue8m0)


@schema_defaults
def dequantize(
    data: torch.Tensor,
    scale: torch.Tensor,
    block: Sequence[int] = FROM_SCHEMA,
    *,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``data * scale`` per block: E4M3 ``[M, N]`` or packed FP4 uint8 ``[M, N/2]`` data, FP32 /
    ``float8_e8m0fnu`` scales ``[ceil(M/rows), ceil(N/cols)]`` or int32 (int16) packed UE8M0 ones, computed in
    FP32 and rounded once to ``out_dtype`` (default FP32). Differentiable w.r.t. an FP32 ``scale`` only.

    >>> q, sf = quantize_fp8(torch.ones(2, 128), use_ue8m0=True)
    >>> dequantize(q, sf).unique().tolist()
    [1.0]
    """
    return _dequantize(data, scale, list(block), out_dtype)


@schema_defaults
def quantize_blocks(
    x: torch.Tensor,
    fmt: str,
    block: Sequence[int],
    *,
    round_sf: bool = FROM_SCHEMA,
    sf: torch.Tensor | None = None,
    amax_clamp: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """TileKernels' cast: ``(data, sf)`` of ``x [M, N]`` in ``block = (rows, cols)`` blocks, ``sf`` the FP32
    dequantization scale ``[ceil(M/rows), ceil(N/cols)]`` (``x ≈ decode(data) · sf``).

    ``fmt="e4m3"``: E4M3 ``[M, N]``; ``"e2m1"``: uint8 ``[M, N/2]`` (element ``2j`` in the low nibble), rounded to
    nearest with ties to the even code (0.75 -> 1, 2.5 -> 2), saturating at 6. Per block: ``amax`` over the real
    elements, floored at ``amax_clamp`` (1e-4 for E4M3, 6·2^-126 for E2M1 by default), ``sf = amax / max``; the
    codes are ``x · (max / amax)`` (not ``x / sf``), or ``x · (1 / sf)`` with ``round_sf`` (``sf`` rounded up to a
    power of two) or a given ``sf`` (returned as is). Differs from ``quantize_fp8`` / ``quantize_fp4`` (DeepGEMM's
    rules) in that multiplier, the E2M1 ties and floor. Not differentiable.

    >>> data, sf = quantize_blocks(torch.tensor([[0.75, -3.0, 2.5, 6.0]]), "e2m1", (1, 4), round_sf=True)
    >>> sf.tolist(), [hex(b) for b in data.flatten().tolist()]
    ([[1.0]], ['0xd2', '0x74'])
    """
    return _quantize_blocks(x, fmt, list(block), round_sf, sf, amax_clamp)
