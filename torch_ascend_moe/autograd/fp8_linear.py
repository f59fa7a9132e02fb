"""Backward of the fp8_linear family: straight-through estimator for the casts inside the ops.

``fp8_linear`` (DeepSeek-V3's training recipe): dgrad ``grad @ W`` quantizes ``grad`` per token in
1 x block groups and reuses W's block x block cast; wgrad ``grad^T @ x`` quantizes both along the token
axis (1 x block per channel). The casts are the quant family's ops (``quantize_fp8``: the C++ kernel on CPU).
Reduction axes that are not a multiple of block are zero-padded, which adds nothing to the products: the
codes are padded (zeros never raise a block's amax, so the scales are the unpadded tensor's), and the
per-channel casts along the tokens are ``block x 1`` casts of ``grad`` and ``x`` whose (1-byte) codes are
transposed, so no high-precision copy is padded or transposed. With ``fp8_backward=False`` both run in the
input precision through ``bf16_gemm``. ``fp8_quant_gemm``'s weight is already FP8, so its dgrad is the exact
``grad @ deq(b)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad
from torch_ascend_moe.ops.fp8_gemm import fp8_gemm
from torch_ascend_moe.ops.gemm import bf16_gemm
from torch_ascend_moe.ops.quant import quantize_fp8
from torch_ascend_moe.quant.reference import dequantized

LINEAR, QUANT_GEMM = "fp8_linear", "fp8_quant_gemm"


def _pad_codes(q: torch.Tensor, cols: int) -> torch.Tensor:
    """E4M3 codes ``q [R, C]`` zero-padded (code 0 is 0.0) to ``[R, cols]``."""
    if cols == q.shape[1]:
        return q
    return F.pad(q.view(torch.uint8), (0, cols - q.shape[1])).view(torch.float8_e4m3fn)


def _transposed_codes(q: torch.Tensor, cols: int) -> torch.Tensor:
    """``q [R, C]`` transposed and zero-padded to ``[C, cols]``, row-major: fp8_gemm re-reads a large MN-major A
    panel by panel (a byte transpose each time), so one copy of the codes is cheaper (wgrad 4096x2048x2048: 555 ->
    377 ms) and is a quarter of the bytes a high-precision transpose moves."""
    out = q.new_zeros((q.shape[1], cols), dtype=torch.uint8)
    out[:, : q.shape[0]] = q.view(torch.uint8).t()
    return out.view(torch.float8_e4m3fn)


def _linear_setup_context(ctx, inputs, output):
    args = arguments(LINEAR, inputs)
    ctx.save_for_backward(args.x, args.weight)
    ctx.block, ctx.use_ue8m0, ctx.fp8_backward = args.block, args.use_ue8m0, args.fp8_backward


def _linear_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    g, blk, ue8m0 = grad.to(x.dtype), ctx.block, ctx.use_ue8m0
    m, n = x.shape[0], weight.shape[0]
    grad_x = grad_w = grad_b = None
    if needs_grad(ctx, LINEAR, "x"):
        if ctx.fp8_backward:
            # grad [M, N] @ W [N, K]: N is the reduction, padded to whole blocks in both operands.
            n_pad = n + (-n) % blk
            qg, sg = quantize_fp8(g, (1, blk), use_ue8m0=ue8m0)
            qw, sw = quantize_fp8(weight, (blk, blk), use_ue8m0=ue8m0)
            grad_x = fp8_gemm(
                _pad_codes(qg, n_pad),
                sg,
                _transposed_codes(qw, n_pad),
                sw.t(),
                recipe_a=(1, blk),
                recipe_b=(blk, blk),
                out_dtype=torch.float32,
            ).to(x.dtype)
        else:
            grad_x = bf16_gemm(g, weight.t())
    if needs_grad(ctx, LINEAR, "weight"):
        if ctx.fp8_backward:
            # grad^T [N, M] @ x [M, K]: tokens are the reduction, both cast 1 x block per channel along them,
            # i.e. block x 1 casts of grad and x, whose codes are transposed.
            m_pad = m + (-m) % blk
            qg, sg = quantize_fp8(g, (blk, 1), use_ue8m0=ue8m0)
            qx, sx = quantize_fp8(x, (blk, 1), use_ue8m0=ue8m0)
            grad_w = fp8_gemm(
                _transposed_codes(qg, m_pad),
                sg.t(),
                _transposed_codes(qx, m_pad),
                sx.t(),
                recipe_a=(1, blk),
                recipe_b=(1, blk),
                out_dtype=torch.float32,
            ).to(weight.dtype)
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
        grad_x = bf16_gemm(grad.float(), dequantized(b, sfb, ctx.recipe_b).t(), alpha=ctx.alpha).to(ctx.x_dtype)
    grad_c = grad.to(ctx.c_dtype) if needs_grad(ctx, QUANT_GEMM, "c") else None
    return gradients(QUANT_GEMM, x=grad_x, c=grad_c)


autograd(LINEAR, _linear_backward, _linear_setup_context)
autograd(QUANT_GEMM, _quant_gemm_backward, _quant_gemm_setup_context)
