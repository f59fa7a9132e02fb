"""The fp8_linear family: FP8 GEMMs on high-precision inputs, quantized inside the op.

Gradients reach the high-precision tensors through a straight-through estimator (the cast's
derivative is taken as the identity), which is how FP8 training keeps BF16/FP32 master weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_fp8_quant_gemm = torch.ops.ascend_moe.fp8_quant_gemm.default
_fp8_linear = torch.ops.ascend_moe.fp8_linear.default


@schema_defaults
def fp8_quant_gemm(
    x: torch.Tensor,
    b: torch.Tensor,
    sfb: torch.Tensor,
    c: torch.Tensor | None = None,
    *,
    gran_k: int = FROM_SCHEMA,
    recipe_b: Sequence[int] = FROM_SCHEMA,
    use_ue8m0: bool = FROM_SCHEMA,
    alpha: float = FROM_SCHEMA,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """Inference path: cast ``x`` (BF16/FP32 ``[M, K]``) per token in ``1 x gran_k`` groups to FP8 and
    multiply with the pre-quantized weight ``(b, sfb)`` (as in ``fp8_gemm``). Output ``x.dtype`` by default.

    >>> from torch_ascend_moe.quant import per_block_cast_to_fp8
    >>> w, sw = per_block_cast_to_fp8(torch.randn(8, 256), use_ue8m0=False)
    >>> fp8_quant_gemm(torch.randn(4, 256, dtype=torch.bfloat16), w, sw).dtype
    torch.bfloat16
    """
    return _fp8_quant_gemm(x, b, sfb, c, gran_k, list(recipe_b), use_ue8m0, alpha, out_dtype)


@schema_defaults
def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    block: int = FROM_SCHEMA,
    use_ue8m0: bool = FROM_SCHEMA,
    fp8_backward: bool = FROM_SCHEMA,
) -> torch.Tensor:
    """Training path: ``x @ weight^T + bias`` with DeepSeek-V3's FP8 recipe (``x`` 1 x block per token,
    ``weight`` block x block), both cast inside the op from BF16/FP32. Backward: dgrad and wgrad GEMMs in FP8
    on requantized gradients (``fp8_backward=True``) or in the input precision.
    """
    return _fp8_linear(x, weight, bias, block, use_ue8m0, fp8_backward)
