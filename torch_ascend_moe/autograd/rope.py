"""Backward of ``rotary_embedding``: each pair's rotation is orthogonal, so the gradient is the inverse rotation
(``conjugate`` flipped) of the output gradient; the cache is a constant (not differentiable)."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients

OP = "rotary_embedding"
_op = torch.ops.ascend_moe.rotary_embedding.default


def _setup(ctx, inputs, output):
    args = arguments(OP, inputs)
    ctx.options = (args.seqlen_offset, args.interleaved, not args.conjugate)
    ctx.save_for_backward(args.cos_sin_cache, args.positions)


def _backward(ctx, grad):
    cache, positions = ctx.saved_tensors
    offset, interleaved, conjugate = ctx.options
    return gradients(OP, x=_op(grad.contiguous(), cache, positions, offset, interleaved, conjugate))


autograd(OP, _backward, _setup)
