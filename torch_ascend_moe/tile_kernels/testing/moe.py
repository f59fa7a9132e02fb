"""``tile_kernels.testing.moe`` (the Ascend era's): gate logits whose top-k boundary is stable, so a kernel and its
reference cannot pick different experts over a rounding difference."""

from __future__ import annotations

import torch

from torch_ascend_moe.tile_kernels.config import get_device
from torch_ascend_moe.tile_kernels.rand import randn
from torch_ascend_moe.tile_kernels.torch.topk import sqrt_softplus_ref

_GAP = 1e-6  # the smallest score gap kept between the k-th and the (k+1)-th expert
_TRIES = 100


def construct_logits(params: dict, kwargs: dict) -> torch.Tensor:
    """FP32 logits ``[num_seqs * (num_tokens + num_padded_tokens), num_routed_experts]``: rows whose k-th and
    (k+1)-th biased scores (``sqrt_softplus + bias``, the image bias on image tokens) lie within 1e-6 are drawn
    again."""
    tokens = params.get("num_seqs", 1) * (params["num_tokens"] + params["num_padded_tokens"])
    experts, k = params["num_routed_experts"], params["num_topk"]
    logits = randn((tokens, experts), dtype=torch.float, device=get_device())
    bias = kwargs["bias"]
    if bias is None:
        bias = torch.zeros(experts, dtype=torch.float32, device=logits.device)
    if kwargs["image_token_mask"] is not None:
        bias = torch.where(kwargs["image_token_mask"].unsqueeze(-1), kwargs["image_bias"].unsqueeze(0), bias)
    else:
        bias = bias.unsqueeze(0).expand(tokens, experts)
    scores = sqrt_softplus_ref(logits) + bias
    for _ in range(_TRIES):
        best = torch.topk(scores, k + 1, dim=-1).values
        unstable = best[:, k - 1] - best[:, k] <= _GAP
        if not unstable.any():
            return logits
        logits[unstable] = randn((int(unstable.sum()), experts), dtype=torch.float, device=logits.device)
        scores[unstable] = sqrt_softplus_ref(logits[unstable]) + bias[unstable]
    raise RuntimeError("construct_logits: no inputs with a stable top-k boundary in 100 draws")
