"""The norm family: RMSNorm with the residual add, an output scale and the fused per-token FP8 cast (TileKernels'
``norm_forward(_and_per_token_cast)``), and its gradient (``norm_backward``)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_forward = torch.ops.ascend_moe.rms_norm.default
_quant = torch.ops.ascend_moe.rms_norm_quant.default
_backward = torch.ops.ascend_moe.rms_norm_backward.default


@schema_defaults
def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = FROM_SCHEMA,
    *,
    residual: torch.Tensor | None = None,
    out_scale: float = FROM_SCHEMA,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, rstd, residual_out)`` of ``x [..., H]``: ``s = x + residual`` (rounded to x's dtype), ``rstd =
    rsqrt(Σs²/H + eps)`` (FP32), ``out = s · rstd · (weight · out_scale)`` rounded to x's dtype; ``residual_out = s``
    (empty without a residual). Differentiable in x, residual and weight.

    >>> out, rstd, _ = rms_norm(torch.tensor([[3.0, 4.0]]), eps=0.0)
    >>> [round(v, 4) for v in out[0].tolist()], round(float(rstd), 4)
    ([0.8485, 1.1314], 0.2828)
    """
    return _forward(x, weight, eps, residual, out_scale)


@schema_defaults
def rms_norm_quant(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    eps: float = FROM_SCHEMA,
    *,
    residual: torch.Tensor | None = None,
    out_scale: float = FROM_SCHEMA,
    num_per_channels: int = FROM_SCHEMA,
    round_sf: bool = FROM_SCHEMA,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out_fp8, out_sf, out, rstd, residual_out)``: :func:`rms_norm` and the per-token E4M3 cast of its rounded
    output in blocks of ``num_per_channels`` (TileKernels' rule; ``round_sf`` = power-of-two scales) with FP32
    scales ``[..., ceil(H / num_per_channels)]``. Not differentiable (the inference path)."""
    return _quant(x, weight, eps, residual, out_scale, num_per_channels, round_sf)


@schema_defaults
def rms_norm_backward(
    out_grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    rstd: torch.Tensor,
    *,
    residual_out_grad: torch.Tensor | None = None,
    out_scale: float = FROM_SCHEMA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x_grad, weight_grad)`` of :func:`rms_norm` from its input sum ``x`` (``s``) and ``rstd``: ``x_grad =
    (gw − x̂·mean(x̂·gw))·rstd (+ residual_out_grad)`` with ``x̂ = x·rstd``, ``g = out_grad·out_scale``, ``gw =
    g·weight``; ``weight_grad = Σ_rows x̂·g`` in FP32 (empty without a weight)."""
    return _backward(out_grad, x, weight, rstd, residual_out_grad, out_scale)
