"""Fake of ``rotary_embedding``; the checks are ``torch_ascend_moe/checks/rope.py``."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.rope import rope_signature


@fake
def rotary_embedding(args):
    rope_signature(args)
    return torch.empty_like(args.x, memory_format=torch.contiguous_format)
