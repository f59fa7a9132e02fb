"""Fake of ``hc_prenorm_gemm``; the checks and the split rule are ``torch_ascend_moe/checks/hc_prenorm.py``."""

from __future__ import annotations

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.hc_prenorm import hc_prenorm_signature


@fake
def hc_prenorm_gemm(a, b, num_splits):
    acc = hc_prenorm_signature(a, b, num_splits)
    lead = [] if num_splits is None else [num_splits]
    return a.new_empty([*lead, a.shape[0], b.shape[0]], dtype=acc), a.new_empty([*lead, a.shape[0]], dtype=acc)
