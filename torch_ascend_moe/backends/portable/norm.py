"""Device-generic norm family: TileKernels' RMSNorm references' operations in their order (a row sum of squares, the
reciprocal square root, two products), plus quantize_blocks' per-token cast of the rounded output. On the CPU the
C++ kernels (csrc/ops/norm_cpu.cpp) compute the same operations in one pass per chunk of rows, bit for bit these."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.backends.portable.quant import tile_cast
from torch_ascend_moe.checks import norm as checks
from torch_ascend_moe.quant.encodings import E4M3_AMAX_FLOOR


def normalized(args) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(out, rstd, residual_out)`` of checked arguments. The rows are made contiguous first: the row sums' order is
    then the one the C++ kernel (csrc/ops/norm_cpu.cpp) takes, whatever x's strides."""
    x, weight = args.x.contiguous(), args.weight
    acc = checks.compute_dtype(x)
    s = x if args.residual is None else (x + args.residual.contiguous()).to(x.dtype)
    sf = s.to(acc)
    rstd = (sf.square().sum(dim=-1) / x.shape[-1] + args.eps).rsqrt()
    scale = args.out_scale if weight is None else weight.to(acc) * args.out_scale
    out = (sf * rstd[..., None] * scale).to(x.dtype)
    residual_out = s.contiguous() if args.residual is not None else x.new_empty([0])
    return out.contiguous(), rstd, residual_out


@portable_kernel
def rms_norm(args):
    checks.forward_signature(args)
    return normalized(args)


@portable_kernel
def rms_norm_quant(args):
    checks.quant_signature(args)
    out, rstd, residual_out = normalized(args)
    x, h = args.x, args.x.shape[-1]
    data, sf = tile_cast(
        out.reshape(-1, h).float(), "e4m3", [1, args.num_per_channels], args.round_sf, None, E4M3_AMAX_FLOOR
    )
    return data.view(x.shape), sf.view(*x.shape[:-1], sf.shape[-1]), out, rstd, residual_out


@portable_kernel
def rms_norm_backward(args):
    checks.backward_signature(args)
    x, weight, rstd = args.x.contiguous(), args.weight, args.rstd
    acc = checks.compute_dtype(x)
    h = x.shape[-1]
    xhat = x.to(acc) * rstd[..., None]
    g = args.out_grad.contiguous().to(acc) * args.out_scale
    gw = g if weight is None else g * weight.to(acc)
    mean = (xhat * gw).sum(dim=-1, keepdim=True) / h
    x_grad = (gw - xhat * mean) * rstd[..., None]
    if args.residual_out_grad is not None:
        x_grad = x_grad + args.residual_out_grad.to(acc)
    if weight is None:
        weight_grad = x.new_empty([0], dtype=acc)
    else:
        weight_grad = (xhat * g).reshape(-1, h).sum(dim=0)
    return x_grad.to(x.dtype).contiguous(), weight_grad
