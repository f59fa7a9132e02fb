"""Fake of ``hc_prenorm_gemm`` and its split rule; the checks are ``torch_ascend_moe/checks/hc_prenorm.py``."""

from __future__ import annotations

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.hc_prenorm import BLOCK_K, hc_prenorm_signature


def split_ranges(k: int, num_splits: int) -> list[tuple[int, int]]:
    """DeepGEMM's split rule: K in 64-wide blocks; split s takes floor(nb/S) blocks, one more if s < nb % S."""
    nb = k // BLOCK_K
    ranges = []
    for s in range(num_splits):
        first, blocks = s * (nb // num_splits) + min(s, nb % num_splits), nb // num_splits + (s < nb % num_splits)
        ranges.append((first * BLOCK_K, (first + blocks) * BLOCK_K))
    return ranges


@fake
def hc_prenorm_gemm(a, b, num_splits):
    acc = hc_prenorm_signature(a, b, num_splits)
    lead = [] if num_splits is None else [num_splits]
    return a.new_empty([*lead, a.shape[0], b.shape[0]], dtype=acc), a.new_empty([*lead, a.shape[0]], dtype=acc)
