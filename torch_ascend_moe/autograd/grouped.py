"""Backward of the grouped family, closed under differentiation (compiled backward graphs hold our ops).

m-grouped ``D[i] = A[i] B[g(i)]^T``: ``dA`` is the m-grouped GEMM of ``dD`` with ``B[g]`` transposed (a view),
``dB[g] = sum_{i in g} dD[i]^T A[i]`` is the k-grouped GEMM. k-grouped ``D[g] = C[g] + sum A[s]^T B[s]``:
``dA[s] = B[s] dD[g]^T`` and ``dB[s] = A[s] dD[g]`` are m-grouped GEMMs. Masked: rows beyond ``masked_m``
do not touch the output, so their gradient is zero (and their values, possibly garbage, are masked out).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.ops.gemm import bf16_bmm
from torch_ascend_moe.ops.grouped import (
    k_grouped_bf16_gemm,
    m_grouped_bf16_gemm,
    m_grouped_bf16_gemm_masked,
    m_grouped_fp8_gemm,
)
from torch_ascend_moe.quant import block_cast_to_fp8


def _needs(ctx, i: int) -> bool:
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


def _with_defaults(inputs, defaults) -> tuple:
    # The dispatcher drops trailing arguments left at their defaults.
    return (*inputs, *defaults[len(inputs) :])


def _m_setup(ctx, inputs, output):
    a, b, layout, psum, alignment, _ = _with_defaults(inputs, (None, None, None, True, 1, None))
    ctx.save_for_backward(a, b, layout)
    ctx.psum, ctx.alignment = psum, alignment


def _m_backward(ctx, grad):
    a, b, layout = ctx.saved_tensors
    kw = {"psum": ctx.psum, "alignment": ctx.alignment}
    grad_a = m_grouped_bf16_gemm(grad, b.transpose(1, 2), layout, out_dtype=a.dtype, **kw) if _needs(ctx, 0) else None
    grad_b = k_grouped_bf16_gemm(grad, a, layout, b.shape[0], out_dtype=b.dtype, **kw) if _needs(ctx, 1) else None
    return grad_a, grad_b, None, None, None, None


def _masked_setup(ctx, inputs, output):
    a, b, masked_m = inputs[:3]
    ctx.save_for_backward(a, b, masked_m)


def _masked_backward(ctx, grad):
    a, b, masked_m = ctx.saved_tensors
    grad_a = (
        m_grouped_bf16_gemm_masked(grad, b.transpose(1, 2), masked_m, out_dtype=a.dtype) if _needs(ctx, 0) else None
    )
    grad_b = None
    if _needs(ctx, 1):
        valid = (torch.arange(a.shape[1], device=a.device) < masked_m.unsqueeze(1)).unsqueeze(-1)
        g, x = torch.where(valid, grad, 0).to(a.dtype), torch.where(valid, a, 0)
        grad_b = bf16_bmm(g.transpose(1, 2), x.transpose(1, 2), out_dtype=b.dtype)
    return grad_a, grad_b, None, None


def _k_setup(ctx, inputs, output):
    a, b, layout, num_groups, psum, alignment, c, _ = _with_defaults(
        inputs, (None, None, None, None, True, 1, None, None)
    )
    ctx.save_for_backward(a, b, layout)
    ctx.psum, ctx.alignment = psum, alignment
    ctx.c_dtype = None if c is None else c.dtype


def _k_backward(ctx, grad):
    a, b, layout = ctx.saved_tensors
    kw = {"psum": ctx.psum, "alignment": ctx.alignment}
    grad_a = m_grouped_bf16_gemm(b, grad, layout, out_dtype=a.dtype, **kw) if _needs(ctx, 0) else None
    grad_b = m_grouped_bf16_gemm(a, grad.transpose(1, 2), layout, out_dtype=b.dtype, **kw) if _needs(ctx, 1) else None
    grad_c = grad.to(ctx.c_dtype) if _needs(ctx, 6) else None
    return grad_a, grad_b, None, None, None, None, grad_c, None


def _linear_setup(ctx, inputs, output):
    x, weight, layout, psum, alignment, block, use_ue8m0, fp8_backward = _with_defaults(
        inputs, (None, None, None, True, 1, 128, False, True)
    )
    ctx.save_for_backward(x, weight, layout)
    ctx.psum, ctx.alignment, ctx.block, ctx.use_ue8m0, ctx.fp8_backward = (
        psum,
        alignment,
        block,
        use_ue8m0,
        fp8_backward,
    )


def _linear_backward(ctx, grad):
    """Straight-through: dx = dD @ W[g] (FP8: dD cast 1 x block per token, W[g]^T in block x block blocks,
    N zero-padded to whole blocks), dW[g] = sum_{i in g} dD[i]^T x[i] in the input precision."""
    x, weight, layout = ctx.saved_tensors
    kw = {"psum": ctx.psum, "alignment": ctx.alignment}
    g, blk = grad.to(x.dtype), ctx.block
    grad_x = grad_w = None
    if _needs(ctx, 0):
        if ctx.fp8_backward:
            pad = (-weight.shape[1]) % blk
            qg, sg = block_cast_to_fp8(F.pad(g, (0, pad)), (1, blk), ctx.use_ue8m0)
            casts = [block_cast_to_fp8(F.pad(w, (0, 0, 0, pad)), (blk, blk), ctx.use_ue8m0) for w in weight]
            qw = torch.stack([c[0] for c in casts]).transpose(1, 2)  # [G, K, N]: MN-major views
            sw = torch.stack([c[1] for c in casts]).transpose(1, 2)
            grad_x = m_grouped_fp8_gemm(
                qg, sg, qw, sw, layout, recipe_a=(1, blk), recipe_b=(blk, blk), out_dtype=torch.float32, **kw
            ).to(x.dtype)
        else:
            grad_x = m_grouped_bf16_gemm(g, weight.transpose(1, 2), layout, out_dtype=x.dtype, **kw)
    if _needs(ctx, 1):
        grad_w = k_grouped_bf16_gemm(g, x, layout, weight.shape[0], out_dtype=weight.dtype, **kw)
    return grad_x, grad_w, None, None, None, None, None, None


def _scaled_setup(ctx, inputs, output):
    pass


def _scaled_backward_for(op: str, n_args: int):
    """Backward of a grouped FP8 op: quantized operands carry no gradient, and scales are refused."""

    def backward(ctx, grad):
        for i, name in ((1, "sfa"), (3, "sfb")):
            if _needs(ctx, i):
                raise RuntimeError(
                    f"ascend_moe::{op}: argument '{name}' requires grad, but scale factors are not differentiable "
                    "here; train BF16/FP32 experts with m_grouped_bf16_gemm (or fp8_linear-style casts) instead"
                )
        return (None,) * n_args

    return backward


torch.library.register_autograd("ascend_moe::m_grouped_bf16_gemm", _m_backward, setup_context=_m_setup)
torch.library.register_autograd("ascend_moe::m_grouped_bf16_gemm_masked", _masked_backward, setup_context=_masked_setup)
torch.library.register_autograd("ascend_moe::k_grouped_bf16_gemm", _k_backward, setup_context=_k_setup)
torch.library.register_autograd(
    "ascend_moe::m_grouped_fp8_gemm", _scaled_backward_for("m_grouped_fp8_gemm", 10), setup_context=_scaled_setup
)
torch.library.register_autograd(
    "ascend_moe::m_grouped_fp8_gemm_masked",
    _scaled_backward_for("m_grouped_fp8_gemm_masked", 8),
    setup_context=_scaled_setup,
)


def _k_fp8_setup(ctx, inputs, output):
    c = inputs[8] if len(inputs) > 8 else None
    ctx.c_dtype = None if c is None else c.dtype


def _k_fp8_backward(ctx, grad):
    for i, name in ((1, "sfa"), (3, "sfb")):
        if _needs(ctx, i):
            raise RuntimeError(
                f"ascend_moe::k_grouped_fp8_gemm: argument '{name}' requires grad, but scale factors are not "
                "differentiable here"
            )
    grad_c = grad.to(ctx.c_dtype) if _needs(ctx, 8) else None
    return None, None, None, None, None, None, None, None, grad_c, None


torch.library.register_autograd("ascend_moe::k_grouped_fp8_gemm", _k_fp8_backward, setup_context=_k_fp8_setup)
torch.library.register_autograd("ascend_moe::m_grouped_fp8_linear", _linear_backward, setup_context=_linear_setup)
