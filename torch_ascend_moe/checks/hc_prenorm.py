"""The hc_prenorm family's argument checks. Twin: ``csrc/ops/hc_prenorm_checks.h`` (the same checks in the
same order, the same words; tests/test_validation_twins.py compares them)."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

OP = "ascend_moe::hc_prenorm_gemm"
BLOCK_K = 64


def split_ranges(k: int, num_splits: int) -> list[tuple[int, int]]:
    """DeepGEMM's split rule: K in 64-wide blocks; split s takes floor(nb/S) blocks, one more if s < nb % S."""
    nb = k // BLOCK_K
    ranges = []
    for s in range(num_splits):
        first, blocks = s * (nb // num_splits) + min(s, nb % num_splits), nb // num_splits + (s < nb % num_splits)
        ranges.append((first * BLOCK_K, (first + blocks) * BLOCK_K))
    return ranges


def hc_prenorm_signature(a, b, num_splits) -> torch.dtype:
    """Checks the arguments; returns the accumulation (and output) dtype."""
    ck.check_rank(OP, "a", a, 2, "[M, K]")
    ck.check_arg(
        a.dtype in (torch.bfloat16, torch.float32, torch.float64),
        OP,
        "a",
        "dtype",
        "torch.bfloat16, torch.float32 or torch.float64",
        a.dtype,
    )
    ck.check_rank(OP, "b", b, 2, "[N, K]")
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    ck.check_arg(
        b.dtype == acc,
        OP,
        "b",
        "dtype",
        "torch.float64 (with a float64 a)" if acc == torch.float64 else "torch.float32",
        b.dtype,
    )
    ck.check_same_device(OP, "b", b, a)
    ck.check_dim_size(OP, "b", b, 1, "K", a.shape[1], "a.size(1)")
    ck.check_arg(a.shape[1] % BLOCK_K == 0, OP, "a", "size(1) (K)", "a multiple of 64", lambda: a.shape[1])
    if num_splits is not None:
        ck.check_arg(num_splits > 0, OP, "num_splits", "value", "None or a positive integer", num_splits)
        ck.check_arg(num_splits <= ck.MAX_INT_ARG, OP, "num_splits", "value", ck.MAX_INT_ARG_TEXT, num_splits)
    return acc
