"""Backward of the grouped family, closed under differentiation (compiled backward graphs hold our ops).

m-grouped ``D[i] = A[i] B[g(i)]^T``: ``dA`` is the m-grouped GEMM of ``dD`` with ``B[g]`` transposed (a view),
``dB[g] = sum_{i in g} dD[i]^T A[i]`` is the k-grouped GEMM. k-grouped ``D[g] = C[g] + sum A[s]^T B[s]``:
``dA[s] = B[s] dD[g]^T`` and ``dB[s] = A[s] dD[g]`` are m-grouped GEMMs. Masked: rows beyond ``masked_m``
do not touch the output, so their gradient is zero (and their values, possibly garbage, are masked out).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe._registry import arguments, autograd, gradients, needs_grad
from torch_ascend_moe.ops.gemm import bf16_bmm
from torch_ascend_moe.ops.grouped import (
    k_grouped_bf16_gemm,
    m_grouped_bf16_gemm,
    m_grouped_bf16_gemm_masked,
    m_grouped_fp8_gemm,
)
from torch_ascend_moe.quant import block_cast_to_fp8
from torch_ascend_moe.quant.reference import dequantized

M, MASKED, K, LINEAR, QUANT, SWIGLU, SWIGLU_FP8 = (
    "m_grouped_bf16_gemm",
    "m_grouped_bf16_gemm_masked",
    "k_grouped_bf16_gemm",
    "m_grouped_fp8_linear",
    "m_grouped_fp8_quant_gemm",
    "m_grouped_bf16_gemm_swiglu",
    "m_grouped_fp8_gemm_swiglu",
)


def _m_setup(ctx, inputs, output):
    args = arguments(M, inputs)
    ctx.save_for_backward(args.a, args.b, args.layout)
    ctx.psum, ctx.alignment = args.psum, args.alignment


def _m_backward(ctx, grad):
    a, b, layout = ctx.saved_tensors
    kw = {"psum": ctx.psum, "alignment": ctx.alignment}
    grad_a = grad_b = None
    if needs_grad(ctx, M, "a"):
        grad_a = m_grouped_bf16_gemm(grad, b.transpose(1, 2), layout, out_dtype=a.dtype, **kw)
    if needs_grad(ctx, M, "b"):
        grad_b = k_grouped_bf16_gemm(grad, a, layout, b.shape[0], out_dtype=b.dtype, **kw)
    return gradients(M, a=grad_a, b=grad_b)


def _masked_setup(ctx, inputs, output):
    args = arguments(MASKED, inputs)
    ctx.save_for_backward(args.a, args.b, args.masked_m)


def _masked_backward(ctx, grad):
    a, b, masked_m = ctx.saved_tensors
    grad_a = grad_b = None
    if needs_grad(ctx, MASKED, "a"):
        grad_a = m_grouped_bf16_gemm_masked(grad, b.transpose(1, 2), masked_m, out_dtype=a.dtype)
    if needs_grad(ctx, MASKED, "b"):
        valid = (torch.arange(a.shape[1], device=a.device) < masked_m.unsqueeze(1)).unsqueeze(-1)
        g, x = torch.where(valid, grad, 0).to(a.dtype), torch.where(valid, a, 0)
        grad_b = bf16_bmm(g.transpose(1, 2), x.transpose(1, 2), out_dtype=b.dtype)
    return gradients(MASKED, a=grad_a, b=grad_b)


def _k_setup(ctx, inputs, output):
    args = arguments(K, inputs)
    ctx.save_for_backward(args.a, args.b, args.layout)
    ctx.psum, ctx.alignment = args.psum, args.alignment
    ctx.c_dtype = None if args.c is None else args.c.dtype


def _k_backward(ctx, grad):
    a, b, layout = ctx.saved_tensors
    kw = {"psum": ctx.psum, "alignment": ctx.alignment}
    grad_a = grad_b = grad_c = None
    if needs_grad(ctx, K, "a"):
        grad_a = m_grouped_bf16_gemm(b, grad, layout, out_dtype=a.dtype, **kw)
    if needs_grad(ctx, K, "b"):
        grad_b = m_grouped_bf16_gemm(a, grad.transpose(1, 2), layout, out_dtype=b.dtype, **kw)
    if needs_grad(ctx, K, "c"):
        grad_c = grad.to(ctx.c_dtype)
    return gradients(K, a=grad_a, b=grad_b, c=grad_c)


def _linear_setup(ctx, inputs, output):
    args = arguments(LINEAR, inputs)
    ctx.save_for_backward(args.x, args.weight, args.layout)
    ctx.psum, ctx.alignment, ctx.block = args.psum, args.alignment, args.block
    ctx.use_ue8m0, ctx.fp8_backward = args.use_ue8m0, args.fp8_backward


def _linear_backward(ctx, grad):
    """Straight-through: dx = dD @ W[g] (FP8: dD cast 1 x block per token, W[g]^T in block x block blocks,
    N zero-padded to whole blocks), dW[g] = sum_{i in g} dD[i]^T x[i] in the input precision."""
    x, weight, layout = ctx.saved_tensors
    kw = {"psum": ctx.psum, "alignment": ctx.alignment}
    g, blk = grad.to(x.dtype), ctx.block
    grad_x = grad_w = None
    if needs_grad(ctx, LINEAR, "x"):
        if ctx.fp8_backward:
            pad = (-weight.shape[1]) % blk
            # Padding copies the whole high-precision operand: only when N is not already whole blocks.
            qg, sg = block_cast_to_fp8(F.pad(g, (0, pad)) if pad else g, (1, blk), ctx.use_ue8m0)
            # Every expert in one cast: with N padded to whole blocks no block straddles two experts, so the
            # [G * N_pad, K] cast is each expert's own block x block cast, stacked (no loop over G).
            wp = F.pad(weight, (0, 0, 0, pad)) if pad else weight
            experts, rows, k = wp.shape
            q, s = block_cast_to_fp8(wp.reshape(experts * rows, k), (blk, blk), ctx.use_ue8m0)
            qw = q.view(experts, rows, k).transpose(1, 2)  # [G, K, N]: MN-major views
            sw = s.view(experts, rows // blk, -1).transpose(1, 2)
            grad_x = m_grouped_fp8_gemm(
                qg, sg, qw, sw, layout, recipe_a=(1, blk), recipe_b=(blk, blk), out_dtype=torch.float32, **kw
            ).to(x.dtype)
        else:
            grad_x = m_grouped_bf16_gemm(g, weight.transpose(1, 2), layout, out_dtype=x.dtype, **kw)
    if needs_grad(ctx, LINEAR, "weight"):
        grad_w = k_grouped_bf16_gemm(g, x, layout, weight.shape[0], out_dtype=weight.dtype, **kw)
    return gradients(LINEAR, x=grad_x, weight=grad_w)


def _quant_setup(ctx, inputs, output):
    args = arguments(QUANT, inputs)
    ctx.save_for_backward(args.b, args.sfb, args.layout)
    ctx.psum, ctx.alignment, ctx.recipe_b, ctx.x_dtype = args.psum, args.alignment, list(args.recipe_b), args.x.dtype


def _quant_backward(ctx, grad):
    """Straight-through (as ``fp8_quant_gemm``'s): dx[i] = dD[i] @ deq(b[g(i)]) exactly, in FP32 rounded once; rows
    no expert owns get zeros (they do not reach the output)."""
    b, sfb, layout = ctx.saved_tensors
    for name in ("b", "sfb"):
        if needs_grad(ctx, QUANT, name):
            raise RuntimeError(
                f"ascend_moe::{QUANT}: argument '{name}' requires grad, but the pre-quantized experts are not "
                "differentiable; train high-precision experts with m_grouped_fp8_linear instead"
            )
    if grad is None or not needs_grad(ctx, QUANT, "x"):
        return gradients(QUANT)
    experts = dequantized(b, sfb, ctx.recipe_b).transpose(1, 2)  # [G, K, N]: D[i] = dD[i] @ deq(b[g])
    grad_x = m_grouped_bf16_gemm(
        grad.float(), experts, layout, psum=ctx.psum, alignment=ctx.alignment, out_dtype=torch.float32
    )
    return gradients(QUANT, x=grad_x.to(ctx.x_dtype))


def _swiglu_setup(ctx, inputs, output):
    args = arguments(SWIGLU, inputs)
    ctx.save_for_backward(args.a, args.b, args.layout, args.row_weights)
    ctx.options = (args.psum, args.alignment, args.activation_clamp, args.quant_gran_k, output[0].dtype)


def _epilogue_gradients(name, grad, operands: dict, wanted: list, l1, options) -> dict:
    """Gradients (by argument name, those in ``wanted``) of a SwiGLU op by recomputation, nothing but the inputs
    kept: ``l1`` rebuilds the L1 output from ``operands`` (``row_weights`` last) with the op's own GEMM op, so no
    ``[M, 2I]`` tensor outlives the forward, and the epilogue is differentiated with autograd (straight-through at
    the roundings; the clamp passes gradient inside its bounds). The FP8 output (``quant_gran_k > 0``) has none."""
    from torch_ascend_moe.backends.portable.grouped import swiglu_epilogue

    clamp, gran, dtype = options
    if gran > 0:
        raise RuntimeError(
            f"ascend_moe::{name}: argument 'quant_gran_k' is {gran}, but the FP8 output has no gradient; "
            "train with quant_gran_k=0"
        )
    leaves = {n: None if t is None else t.detach().requires_grad_(n in wanted) for n, t in operands.items()}
    *l1_operands, row_weights = leaves.values()
    with torch.enable_grad():
        out, _ = swiglu_epilogue(l1(*l1_operands), row_weights, clamp, 0, False, dtype)
        grads = torch.autograd.grad(out, [leaves[n] for n in wanted], grad, allow_unused=True)
    return {n: torch.zeros_like(leaves[n]) if g is None else g for n, g in zip(wanted, grads, strict=True)}


def _swiglu_backward(ctx, grad, grad_scales):
    psum, alignment, clamp, gran, dtype = ctx.options
    wanted = [n for n in ("a", "b", "row_weights") if needs_grad(ctx, SWIGLU, n)]
    if grad is None or not wanted:
        return gradients(SWIGLU)
    a, b, layout, w = ctx.saved_tensors

    def l1(a, b):
        return m_grouped_bf16_gemm(a, b, layout, psum=psum, alignment=alignment)

    operands = {"a": a, "b": b, "row_weights": w}
    return gradients(SWIGLU, **_epilogue_gradients(SWIGLU, grad, operands, wanted, l1, (clamp, gran, dtype)))


def _swiglu_fp8_setup(ctx, inputs, output):
    args = arguments(SWIGLU_FP8, inputs)
    ctx.save_for_backward(args.a, args.sfa, args.b, args.sfb, args.layout, args.row_weights)
    ctx.options = (args.psum, args.alignment, list(args.recipe_a), list(args.recipe_b))
    ctx.epilogue = (args.activation_clamp, args.quant_gran_k, output[0].dtype)


def _swiglu_fp8_backward(ctx, grad, grad_scales):
    """Only ``row_weights`` has a gradient (quantized operands carry none, as in ``m_grouped_fp8_gemm``)."""
    for scale in ("sfa", "sfb"):
        if needs_grad(ctx, SWIGLU_FP8, scale):
            raise RuntimeError(
                f"ascend_moe::{SWIGLU_FP8}: argument '{scale}' requires grad, but scale factors are not "
                f"differentiable here{_TRAIN_BF16}"
            )
    if grad is None or not needs_grad(ctx, SWIGLU_FP8, "row_weights"):
        return gradients(SWIGLU_FP8)
    a, sfa, b, sfb, layout, w = ctx.saved_tensors
    psum, alignment, recipe_a, recipe_b = ctx.options

    def l1():
        return m_grouped_fp8_gemm(
            a, sfa, b, sfb, layout, psum=psum, alignment=alignment, recipe_a=recipe_a, recipe_b=recipe_b
        )

    grads = _epilogue_gradients(SWIGLU_FP8, grad, {"row_weights": w}, ["row_weights"], l1, ctx.epilogue)
    return gradients(SWIGLU_FP8, **grads)


def _register_scaled(name: str, hint: str) -> None:
    """A grouped FP8 op: quantized operands carry no gradient, scales are refused by name, ``c`` (where the op
    has one) gets ``grad``."""

    def setup(ctx, inputs, output):
        c = getattr(arguments(name, inputs), "c", None)
        ctx.c_dtype = None if c is None else c.dtype

    def backward(ctx, grad):
        for scale in ("sfa", "sfb"):
            if needs_grad(ctx, name, scale):
                raise RuntimeError(
                    f"ascend_moe::{name}: argument '{scale}' requires grad, but scale factors are not "
                    f"differentiable here{hint}"
                )
        if ctx.c_dtype is not None and needs_grad(ctx, name, "c"):
            return gradients(name, c=grad.to(ctx.c_dtype))
        return gradients(name)

    autograd(name, backward, setup)


_TRAIN_BF16 = "; train BF16/FP32 experts with m_grouped_bf16_gemm (or fp8_linear-style casts) instead"
_register_scaled("m_grouped_fp8_gemm", _TRAIN_BF16)
_register_scaled("m_grouped_fp8_gemm_masked", _TRAIN_BF16)
_register_scaled("k_grouped_fp8_gemm", "")
autograd(M, _m_backward, _m_setup)
autograd(MASKED, _masked_backward, _masked_setup)
autograd(K, _k_backward, _k_setup)
autograd(LINEAR, _linear_backward, _linear_setup)
autograd(QUANT, _quant_backward, _quant_setup)
autograd(SWIGLU, _swiglu_backward, _swiglu_setup)
autograd(SWIGLU_FP8, _swiglu_fp8_backward, _swiglu_fp8_setup)
