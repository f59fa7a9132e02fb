"""Fake of ``topk_select``; the checks are ``torch_ascend_moe/checks/topk_select.py``."""

from __future__ import annotations

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.topk_select import topk_select_signature


@fake
def topk_select(args):
    idx_dtype = topk_select_signature(args)
    b = args.input.shape[0]
    return args.input.new_empty([b, args.topk]), args.input.new_empty([b, args.topk], dtype=idx_dtype)
