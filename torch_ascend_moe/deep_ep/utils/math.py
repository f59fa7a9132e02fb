"""``deep_ep.utils.math``: the numeric helpers of DeepEP's tests (specs/deepep_api.md §8), upstream's semantics.

Upstream wraps the two casts in ``torch.compile(dynamic=True)``; here they are plain tensor code (the same
values, and no compile on every new shape on CPU).
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.quant.encodings import FP8_MAX
from torch_ascend_moe.testing import count_bytes  # DeepEP's and DeepGEMM's are the same helper


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepEP's ``1 - 2·Σ(x+1)(y+1) / Σ((x+1)² + (y+1)²)`` in float64 (the +1 keeps all-zero inputs defined;
    DeepGEMM's ``calc_diff`` has no +1)."""
    x, y = x.double() + 1, y.double() + 1
    denominator = (x * x + y * y).sum()
    sim = 2 * (x * y).sum() / denominator
    return (1 - sim).item()


def safe_div(a, b) -> float:
    """``a / b``, and 0 for ``0 / 0`` (any other division by zero raises)."""
    try:
        return a / b
    except ZeroDivisionError:
        if a == 0:
            return 0
        raise


def ceil_div(x: int, y: int) -> int:
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    return ceil_div(x, y) * y


def per_token_cast_to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token and 128 channels: ``amax = max(1e-4, max|x|)``, FP8 E4M3 of ``x · 448 / amax``, scales
    ``amax / 448`` as FP32 ``[m, ceil(n / 128)]`` (``n`` padded to 128 with zeros)."""
    ck.check_arg(x.dim() == 2, "deep_ep.utils.math.per_token_cast_to_fp8", "x", "rank", 2, x.dim)
    m, n = x.shape
    aligned_n = align(n, 128)
    x_padded = torch.nn.functional.pad(x, (0, aligned_n - n), mode="constant", value=0)
    x_padded_view = x_padded.view(m, aligned_n // 128, 128)  # explicit: -1 cannot be inferred for 0 tokens
    x_amax = x_padded_view.abs().float().amax(dim=2).view(m, aligned_n // 128).clamp(1e-4)
    fp8 = (x_padded_view * (FP8_MAX / x_amax.unsqueeze(2))).to(torch.float8_e4m3fn)
    return fp8.view(m, aligned_n)[:, :n].contiguous(), (x_amax / FP8_MAX).view(m, aligned_n // 128)


def per_token_cast_back(x_fp8: torch.Tensor, x_scales: torch.Tensor) -> torch.Tensor:
    """BF16 of ``fp8 · scale`` per 128 channels; int32 scales are packed UE8M0 exponent bytes
    (``float(byte << 23)``)."""
    if x_fp8.numel() == 0:
        return x_fp8.to(torch.bfloat16)
    ck.check_arg(x_fp8.dim() == 2, "deep_ep.utils.math.per_token_cast_back", "x_fp8", "rank", 2, x_fp8.dim)
    m, n = x_fp8.shape
    aligned_n = align(n, 128)
    x_fp8_padded = torch.nn.functional.pad(x_fp8, (0, aligned_n - n), mode="constant", value=0)
    if x_scales.dtype == torch.int:
        x_scales = x_scales.contiguous().view(dtype=torch.uint8).to(torch.int) << 23
        x_scales = x_scales.view(dtype=torch.float)
    x_fp32_padded = x_fp8_padded.to(torch.float32).view(m, -1, 128)
    x_scales = x_scales.reshape(m, -1, 1)
    return (x_fp32_padded * x_scales).view(x_fp8_padded.shape).to(torch.bfloat16)[:, :n].contiguous()


def inplace_unique(x: torch.Tensor, num_slots: int) -> None:
    """In place, per row: the distinct values of ``x`` in ``[0, num_slots)`` in descending order, then -1
    (negative entries are empty)."""
    ck.check_arg(x.dim() == 2, "deep_ep.utils.math.inplace_unique", "x", "rank", 2, x.dim)
    mask = x < 0
    x_padded = x.masked_fill(mask, num_slots)
    bin_count = torch.zeros((x.size(0), num_slots + 1), dtype=x.dtype, device=x.device)
    bin_count.scatter_add_(1, x_padded, torch.ones_like(x_padded))
    bin_count = bin_count[:, :num_slots]
    sorted_bin_count, sorted_bin_idx = torch.sort(bin_count, dim=-1, descending=True)
    sorted_bin_idx.masked_fill_(sorted_bin_count == 0, -1)
    sorted_bin_idx = torch.sort(sorted_bin_idx, descending=True, dim=-1).values
    x[:, :].fill_(-1)
    valid_len = min(num_slots, x.size(1))
    x[:, :valid_len] = sorted_bin_idx[:, :valid_len]


def create_grouped_scores(scores: torch.Tensor, group_idx: torch.Tensor, num_groups: int) -> torch.Tensor:
    """``scores`` with the experts of groups not in ``group_idx`` (per token) zeroed (group-limited gating)."""
    num_tokens, num_experts = scores.shape
    scores = scores.view(num_tokens, num_groups, -1)
    mask = torch.zeros((num_tokens, num_groups), dtype=torch.bool, device=scores.device)
    mask = mask.scatter_(1, group_idx, True).unsqueeze(-1).expand_as(scores)
    return (scores * mask).view(num_tokens, num_experts)


def hash_tensor(t: torch.Tensor) -> int:
    """The sum of the tensor's bytes viewed as int32 (run-to-run determinism checks)."""
    return t.view(torch.int).sum().item()


def hash_tensors(*tensors) -> int:
    """XOR of ``hash_tensor`` over the tensors (recursing into tuples/lists, skipping None)."""
    value = 0
    for t in tensors:
        if isinstance(t, (tuple, list)):
            value ^= hash_tensors(*t)
        elif t is not None and isinstance(t, torch.Tensor):
            value ^= hash_tensor(t)
    return value


__all__ = [
    "align",
    "calc_diff",
    "ceil_div",
    "count_bytes",
    "create_grouped_scores",
    "hash_tensor",
    "hash_tensors",
    "inplace_unique",
    "per_token_cast_back",
    "per_token_cast_to_fp8",
    "safe_div",
]
