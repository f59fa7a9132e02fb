"""Backward of ``topk_select``: each selected value's gradient goes back to its column (``input[i, index - offset]``);
padding slots and rows that held NaN get none."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import arguments, autograd, gradients


def _setup(ctx, inputs, output):
    args = arguments("topk_select", inputs)
    values, indices = output
    b, V = args.input.shape
    n = torch.full((b,), V, device=indices.device) if args.end is None else args.end.long()
    # Kept slots: the first min(n, topk) of a row without NaN (such a row's values are all NaN; a kept value
    # of any other row is an element of input, never NaN).
    keep = (torch.arange(args.topk, device=indices.device) < torch.clamp(n, max=args.topk)[:, None]) & ~values.isnan()
    # int64 arithmetic: an int32 index minus its offset need not fit int32. (No `.to` of an int64 tensor here:
    # an op returning its input is not allowed below autograd.)
    cols = indices if indices.dtype == torch.int64 else indices.to(torch.int64)
    if args.output_idx_offset is not None:
        cols = cols - args.output_idx_offset[:, None]
    ctx.columns = V
    ctx.save_for_backward(torch.where(keep, cols, 0), keep)


def _backward(ctx, grad_values, grad_indices):
    cols, keep = ctx.saved_tensors
    grad = grad_values.new_zeros(grad_values.shape[0], ctx.columns)
    grad.scatter_add_(1, cols, torch.where(keep, grad_values, 0))
    return gradients("topk_select", input=grad)


autograd("topk_select", _backward, _setup)
