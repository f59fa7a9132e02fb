"""Fake of ``moe_topk_gate``; the checks are ``torch_ascend_moe/checks/moe_gate.py``."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.moe_gate import moe_topk_gate_signature


@fake
def moe_topk_gate(args):
    sh = moe_topk_gate_signature(args)
    logits = args.logits
    return (
        logits.new_empty([sh.T, sh.slots]),
        logits.new_empty([sh.T, sh.slots], dtype=torch.int64),
        logits.new_empty([sh.T, args.num_topk], dtype=torch.int64),
        logits.new_empty([sh.T, sh.E]),
    )
