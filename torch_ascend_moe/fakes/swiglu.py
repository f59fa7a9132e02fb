"""Fakes of the swiglu family (``swiglu_forward``, ``swiglu_backward``); the checks are
``torch_ascend_moe/checks/swiglu.py``."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.swiglu import FP8, backward_signature, compute_dtype, forward_out_dtype, forward_signature


@fake
def swiglu_forward(args):
    out_shape, sf_shape = forward_signature(args)
    x = args.x
    return (
        x.new_empty(out_shape, dtype=forward_out_dtype(args)),
        x.new_empty(sf_shape, dtype=torch.float32),
        x.new_empty([4], dtype=torch.int64),
    )


@fake
def swiglu_backward(args):
    n, h, out_dtype, sf_cols = backward_signature(args)
    g = args.grad_out
    quantized = sf_cols is not None
    acc = compute_dtype(args.x, g)
    return (
        g.new_empty([n, 2 * h], dtype=out_dtype),
        g.new_empty([n, 2 * h] if quantized else [0], dtype=FP8),
        g.new_empty([n, sf_cols] if quantized else [0], dtype=torch.float32),
        g.new_empty([n] if args.topk_weights is not None else [0], dtype=acc),
        g.new_empty([n, h], dtype=out_dtype),
    )
