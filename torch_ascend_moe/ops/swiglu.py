"""The swiglu family: the experts' SwiGLU between the grouped GEMMs, fused with the routing weight, the clamp and its
counters, DeepGEMM's psum layout and the per-token FP8 cast (TileKernels' ``swiglu_forward(_and_per_token_cast)``
and ``swiglu_backward(_and_per_token_cast)``)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_forward = torch.ops.ascend_moe.swiglu_forward.default
_backward = torch.ops.ascend_moe.swiglu_backward.default


@schema_defaults
def swiglu_forward(
    x: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
    psum_num_tokens_per_expert: torch.Tensor | None = None,
    *,
    alignment: int = FROM_SCHEMA,
    routed_scaling_factor: float | None = None,
    clamp_value: float | None = None,
    out_dtype: torch.dtype | None = None,
    num_per_channels: int = FROM_SCHEMA,
    round_sf: bool = FROM_SCHEMA,
    sf_clamp_min: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out [N, H], sf, clamped_count int64 [4])`` of ``x [N, 2H] = [a | b]``.

    With ``clamp_value`` c: ``a = min(a, c)``, ``b = clamp(b, -c, c)``, and ``clamped_count`` holds #(a > c),
    #(b > c), #(b < -c) and the valid elements (rows in the layout × H). ``out = a / (1 + exp(-a)) * b`` in FP32
    (``out_dtype`` None: FP32, FP64 for FP64 ``x``),
    times ``topk_weights[n] * routed_scaling_factor`` (one weight per expanded row); rows outside the psum layout
    (expert e owns ``[align(psum[e-1], alignment), psum[e])``) are 0. ``out_dtype=torch.float8_e4m3fn`` casts each
    row in blocks of ``num_per_channels`` (TileKernels' rule; ``round_sf`` = power-of-two scales) and returns the
    FP32 scales ``[N, ceil(H / num_per_channels)]``; otherwise ``sf`` is empty. Differentiable in ``x`` and
    ``topk_weights`` unless quantized.

    >>> out, _, _ = swiglu_forward(torch.tensor([[1.0, 2.0]]))
    >>> round(float(out), 4)
    1.4621
    """
    return _forward(
        x, topk_weights, psum_num_tokens_per_expert, alignment, routed_scaling_factor, clamp_value, out_dtype,
        num_per_channels, round_sf, sf_clamp_min,
    )  # fmt: skip


@schema_defaults
def swiglu_backward(
    x: torch.Tensor,
    grad_out: torch.Tensor,
    topk_weights: torch.Tensor | None = None,
    psum_num_tokens_per_expert: torch.Tensor | None = None,
    *,
    x_sf: torch.Tensor | None = None,
    alignment: int = FROM_SCHEMA,
    routed_scaling_factor: float | None = None,
    clamp_value: float | None = None,
    out_dtype: torch.dtype | None = None,
    num_per_channels: int = FROM_SCHEMA,
    round_sf: bool = FROM_SCHEMA,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x_grad [N, 2H], x_grad_fp8, x_grad_sf, weight_grad [N], out [N, H])``: the gradient of
    :func:`swiglu_forward` from ``grad_out [N, H]``, fused with the recomputed forward ``out`` and, when
    ``num_per_channels > 0``, the per-token E4M3 cast of the FP32 ``x_grad`` (else those two are empty). ``x`` may
    be E4M3 with its per-row block scales ``x_sf``. The clamp's elements get zero gradient; ``weight_grad`` (empty
    without weights) is ``Σ_h grad_out · silu(a) · b`` times ``routed_scaling_factor``; rows outside the layout are
    0. ``x_grad`` and ``out`` are in ``out_dtype`` (``grad_out``'s by default)."""
    return _backward(
        x, x_sf, grad_out, topk_weights, psum_num_tokens_per_expert, alignment, routed_scaling_factor, clamp_value,
        out_dtype, num_per_channels, round_sf,
    )  # fmt: skip
