"""Straight-through fake quantization: the values an FP8/FP4 cast produces, with an identity gradient.

Training code that must see quantized numerics (the lightning indexer trains on the values its FP8/FP4
inference kernel will read) multiplies ``fake_quantize(x)`` in high precision; the gradient passes to the
BF16/FP32 source unchanged (straight-through estimator).
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.quant.casts import block_cast_to_fp8, cast_back_from_fp4, dequantize_fp8, per_token_cast_to_fp4

FORMATS = ("fp8", "fp4")


def quantize_rows(x: torch.Tensor, fmt: str, gran: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` -> (FP8 E4M3 or packed FP4 uint8 data, FP32 scales ``[..., ceil(D / gran)]``).

    FP8: ``amax / 448`` per ``1 x gran`` block (``gran = D``: one scale per row). FP4: ``1 x gran`` blocks with
    UE8M0 (power-of-two) scales, MXFP4-style.
    """
    api = "fake_quantize"
    ck.check_arg(fmt in FORMATS, api, "fmt", "value", "'fp8' or 'fp4'", fmt)
    rows = x.reshape(-1, x.shape[-1])
    lead = list(x.shape[:-1])
    if fmt == "fp8":
        data, sf = block_cast_to_fp8(rows, (1, gran), use_ue8m0=False)
        return data.view(x.shape), sf.view(*lead, sf.shape[-1])  # not -1: 0 rows have no size to infer
    data, sf = per_token_cast_to_fp4(rows, True, gran_k=gran)
    return data.view(torch.uint8).view(*lead, data.shape[-1]), sf.view(*lead, sf.shape[-1])


def dequantize_rows(data: torch.Tensor, sf: torch.Tensor, gran: int) -> torch.Tensor:
    rows_sf = sf.reshape(-1, sf.shape[-1]).float()
    if data.dtype == torch.uint8:
        values = cast_back_from_fp4(data.reshape(-1, data.shape[-1]).view(torch.int8), rows_sf, gran_k=gran)
    else:
        values = dequantize_fp8(data.reshape(-1, data.shape[-1]), rows_sf, 1, gran)
    return values.view(*data.shape[:-1], -1)


def fake_quantize(x: torch.Tensor, fmt: str, gran: int) -> torch.Tensor:
    """``dequantize(quantize(x))`` along the last dim in ``1 x gran`` blocks, straight-through gradient.

    Written as ``values + (x - x.detach())``: the cast's values (plus an exact zero) forward, the identity backward,
    in plain tensor ops, which every torch.compile traces (Dynamo before torch 2.13 dropped the backward of an
    autograd.Function around these casts, whose outputs are not differentiable).

    >>> x = torch.randn(4, 64, requires_grad=True)
    >>> y = fake_quantize(x, "fp8", 64)
    >>> torch.autograd.grad(y.sum(), x)[0].eq(1).all().item()
    True
    """
    data, sf = quantize_rows(x.detach(), fmt, gran)
    return dequantize_rows(data, sf, gran).to(x.dtype) + (x - x.detach())
