"""Fakes of the norm family (``rms_norm``, ``rms_norm_quant``, ``rms_norm_backward``); the checks are
``torch_ascend_moe/checks/norm.py``."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import fake
from torch_ascend_moe.checks.norm import backward_signature, compute_dtype, forward_signature, quant_signature

FP8 = torch.float8_e4m3fn


def _norm_outputs(args) -> tuple:
    x = args.x
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        x.new_empty(x.shape[:-1], dtype=compute_dtype(x)),
        torch.empty_like(x, memory_format=torch.contiguous_format) if args.residual is not None else x.new_empty([0]),
    )


@fake
def rms_norm(args):
    forward_signature(args)
    return _norm_outputs(args)


@fake
def rms_norm_quant(args):
    sf = quant_signature(args)
    x = args.x
    return (x.new_empty(x.shape, dtype=FP8), x.new_empty(sf, dtype=torch.float32), *_norm_outputs(args))


@fake
def rms_norm_backward(args):
    backward_signature(args)
    x = args.x
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        x.new_empty([x.shape[-1]] if args.weight is not None else [0], dtype=compute_dtype(x)),
    )
