"""Fake of ``mega_moe``; the checks are ``torch_ascend_moe/checks/mega_moe.py``."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.mega_moe import OP, mega_moe_signature
from torch_ascend_moe.distributed.groups import group_size


@fake
def mega_moe(args):
    mega_moe_signature(args, group_size(OP, args.group_name))
    return (
        args.x.new_empty([args.x.shape[0], args.x.shape[1]], dtype=torch.bfloat16),
        args.x.new_empty([args.l1_weights.shape[0]], dtype=torch.int32),
    )
