"""Fake of ``topk_select``; the checks are ``torch_ascend_moe/checks/topk_select.py``."""

from __future__ import annotations

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.topk_select import INT32 as INT32
from torch_ascend_moe.checks.topk_select import check_end_values as check_end_values
from torch_ascend_moe.checks.topk_select import nan_error as nan_error
from torch_ascend_moe.checks.topk_select import offset_error as offset_error
from torch_ascend_moe.checks.topk_select import topk_select_signature

# DeepSelect's marker of a row that held NaN (abort_when_nan_found=False): every index of the row.
NAN_MARKER = 0x3F3F3F3F


@fake
def topk_select(args):
    idx_dtype = topk_select_signature(args)
    b = args.input.shape[0]
    return args.input.new_empty([b, args.topk]), args.input.new_empty([b, args.topk], dtype=idx_dtype)
