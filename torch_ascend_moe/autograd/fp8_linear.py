"""Backward of the fp8_linear family: straight-through estimator for the casts inside the ops.

``fp8_linear`` (DeepSeek-V3's training recipe): dgrad ``grad @ W`` quantizes ``grad`` per token in
1 x block groups and reuses W's block x block cast; wgrad ``grad^T @ x`` quantizes both along the token
axis (1 x block per channel). Reduction axes that are not a multiple of block are zero-padded, which adds
nothing to the products. With ``fp8_backward=False`` both run in the input precision through
``bf16_gemm``. ``fp8_quant_gemm``'s weight is already FP8, so its dgrad is the exact ``grad @ deq(b)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad
from torch_ascend_moe.backends.portable.fp8_gemm import dequantize
from torch_ascend_moe.ops.fp8_gemm import fp8_gemm
from torch_ascend_moe.ops.gemm import bf16_gemm
from torch_ascend_moe.quant import block_cast_to_fp8

LINEAR, QUANT_GEMM = "fp8_linear", "fp8_quant_gemm"


def _pad_rows(x: torch.Tensor, multiple: int) -> torch.Tensor:
    return F.pad(x, (0, 0, 0, (-x.shape[0]) % multiple))


def _fp8_nt(a: torch.Tensor, b: torch.Tensor, recipe_a, recipe_b, use_ue8m0: bool) -> torch.Tensor:
    """FP32 ``a @ b^T`` of two high-precision operands cast with the given block recipes."""
    qa, sa = block_cast_to_fp8(a, recipe_a, use_ue8m0)
    qb, sb = block_cast_to_fp8(b, recipe_b, use_ue8m0)
    return fp8_gemm(qa, sa, qb, sb, recipe_a=recipe_a, recipe_b=recipe_b, out_dtype=torch.float32)


def _linear_setup_context(ctx, inputs, output):
    args = arguments(LINEAR, inputs)
    ctx.save_for_backward(args.x, args.weight)
    ctx.block, ctx.use_ue8m0, ctx.fp8_backward = args.block, args.use_ue8m0, args.fp8_backward


def _linear_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    g, blk = grad.to(x.dtype), ctx.block
    grad_x = grad_w = grad_b = None
    if needs_grad(ctx, LINEAR, "x"):
        if ctx.fp8_backward:
            # grad [M, N] @ W [N, K]: N is the reduction, padded to whole blocks in both operands.
            g_pad = F.pad(g, (0, (-g.shape[1]) % blk))
            w_pad = _pad_rows(weight, blk)
            qw, sw = block_cast_to_fp8(w_pad, (blk, blk), ctx.use_ue8m0)
            qg, sg = block_cast_to_fp8(g_pad, (1, blk), ctx.use_ue8m0)
            grad_x = fp8_gemm(
                qg, sg, qw.t(), sw.t(), recipe_a=(1, blk), recipe_b=(blk, blk), out_dtype=torch.float32
            ).to(x.dtype)
        else:
            grad_x = bf16_gemm(g, weight.t())
    if needs_grad(ctx, LINEAR, "weight"):
        if ctx.fp8_backward:
            # grad^T [N, M] @ x [M, K]: tokens are the reduction, both cast per channel along them.
            grad_w = _fp8_nt(_pad_rows(g, blk).t(), _pad_rows(x, blk).t(), (1, blk), (1, blk), ctx.use_ue8m0)
            grad_w = grad_w.to(weight.dtype)
        else:
            grad_w = bf16_gemm(g.t(), x.t())
    if needs_grad(ctx, LINEAR, "bias"):
        grad_b = g.float().sum(0).to(x.dtype)
    return gradients(LINEAR, x=grad_x, weight=grad_w, bias=grad_b)


def _quant_gemm_setup_context(ctx, inputs, output):
    args = arguments(QUANT_GEMM, inputs)
    ctx.save_for_backward(args.b, args.sfb)
    ctx.recipe_b, ctx.alpha, ctx.x_dtype = list(args.recipe_b), args.alpha, args.x.dtype
    ctx.c_dtype = None if args.c is None else args.c.dtype


def _quant_gemm_backward(ctx, grad):
    b, sfb = ctx.saved_tensors
    for name in ("b", "sfb"):
        if needs_grad(ctx, QUANT_GEMM, name):
            raise RuntimeError(
                f"ascend_moe::fp8_quant_gemm: argument '{name}' requires grad, but the pre-quantized weight "
                "is not differentiable; train a high-precision weight with fp8_linear instead"
            )
    grad_x = None
    if needs_grad(ctx, QUANT_GEMM, "x"):
        grad_x = bf16_gemm(grad.float(), dequantize(b, sfb, ctx.recipe_b).t(), alpha=ctx.alpha).to(ctx.x_dtype)
    grad_c = grad.to(ctx.c_dtype) if needs_grad(ctx, QUANT_GEMM, "c") else None
    return gradients(QUANT_GEMM, x=grad_x, c=grad_c)


autograd(LINEAR, _linear_backward, _linear_setup_context)
autograd(QUANT_GEMM, _quant_gemm_backward, _quant_gemm_setup_context)
