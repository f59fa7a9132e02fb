"""Sample inputs, references, bad inputs and the harness specs of the norm family.

Shapes are TileKernels' norm tests' kinds scaled for a CPU: 2-D and 3-D inputs, with and without a weight and a
residual, output scales, the fused per-token E4M3 cast in blocks of 32 (and of 8 on small samples), empty rows.
References: the spec's formulas (§10.4) in FP64 from the residual sum rounded to x's dtype (part of the spec); the
E4M3 outputs from the spec-order FP32 output rounded to x's dtype, through ``tests/quant/specs.py``'s element-by-element
cast reference.
"""

from __future__ import annotations

import torch

from tests.quant.specs import quantize_blocks_reference
from torch_ascend_moe.backends.portable import norm as portable
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

# (shape, weight, residual, out_scale, num_per_channels, round_sf)
_CASES = [
    ([37, 256], True, True, 1.0, 0, False),
    ([2, 9, 128], True, False, 0.5, 32, True),
    ([13, 64], False, True, 2.0, 32, False),
    ([0, 64], True, True, 1.0, 0, False),
]
_CASES_SMALL = [([5, 16], True, True, 1.5, 0, False), ([2, 3, 16], False, False, 1.0, 8, True)]


def _draw(shape, dtype, g):
    return (torch.randn(shape, generator=g, dtype=torch.float64) * 2).to(dtype)


def _samples(device, dtype, requires_grad, small, quant: bool) -> list[SampleInput]:
    g = torch.Generator().manual_seed(12)
    out = []
    for shape, weighted, with_residual, scale, npc, round_sf in _CASES_SMALL if small else _CASES:
        x = _draw(shape, dtype, g)
        w = _draw([shape[-1]], dtype, g) if weighted else None
        r = _draw(shape, dtype, g) if with_residual else None
        args = (
            x.to(device).requires_grad_(requires_grad),
            None if w is None else w.to(device).requires_grad_(requires_grad),
            1e-6,
            None if r is None else r.to(device).requires_grad_(requires_grad),
            scale,
        )  # fmt: skip
        if quant:
            args += (npc or 32, round_sf)
        out.append(SampleInput(args, f"{shape} w{weighted} r{with_residual} s{scale}" + (f" npc{npc or 32}" * quant)))
    return out


def forward_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    return _samples(device, dtype, requires_grad, small, quant=False)


def quant_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    return _samples(device, dtype, requires_grad, small, quant=True)


def _sum(x, residual):
    x = x.detach().cpu()
    return x if residual is None else (x + residual.detach().cpu()).to(x.dtype)


def forward_reference(x, weight, eps, residual, out_scale):
    s = _sum(x, residual)
    s64 = s.double()
    rstd = 1 / torch.sqrt((s64 * s64).sum(-1) / x.shape[-1] + eps)
    w = 1.0 if weight is None else weight.detach().cpu().double()
    out = s64 * rstd[..., None] * (w * out_scale)
    return out, rstd, s64 if residual is not None else torch.zeros(0, dtype=torch.float64)


def quant_reference(x, weight, eps, residual, out_scale, num_per_channels, round_sf):
    """The cast takes the spec-order FP32 output rounded to x's dtype."""
    h = x.shape[-1]
    s32 = _sum(x, residual).to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    rstd32 = (s32.square().sum(-1) / h + eps).rsqrt()
    w32 = 1.0 if weight is None else weight.detach().cpu().to(s32.dtype)
    rounded = (s32 * rstd32[..., None] * (w32 * out_scale)).to(x.dtype)
    data, sf = quantize_blocks_reference(rounded.reshape(-1, h), "e4m3", [1, num_per_channels], round_sf, None, None)
    return (
        data.view(x.shape),
        sf.view(*x.shape[:-1], sf.shape[-1]),
        *forward_reference(x, weight, eps, residual, out_scale),
    )


def backward_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(13)
    out = []
    for shape, weighted, with_residual, scale, _, _ in _CASES_SMALL if small else _CASES:
        x = _draw(shape, dtype, g)
        w = _draw([shape[-1]], dtype, g) if weighted else None
        rstd_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        rstd = (x.to(rstd_dtype).square().mean(-1) + 1e-6).rsqrt()
        grad = _draw(shape, dtype, g)
        rg = _draw(shape, dtype, g) if with_residual else None
        args = (
            grad.to(device).requires_grad_(requires_grad), x.to(device).requires_grad_(requires_grad),
            None if w is None else w.to(device), rstd.to(device), None if rg is None else rg.to(device), scale,
        )  # fmt: skip
        out.append(SampleInput(args, f"{shape} w{weighted} r{with_residual} s{scale}"))
    return out


def backward_reference(out_grad, x, weight, rstd, residual_out_grad, out_scale):
    x64, r64 = x.detach().cpu().double(), rstd.detach().cpu().double()
    h = x.shape[-1]
    xhat = x64 * r64[..., None]
    g = out_grad.detach().cpu().double() * out_scale
    w = torch.ones(h, dtype=torch.float64) if weight is None else weight.detach().cpu().double()
    gw = g * w
    x_grad = (gw - xhat * (xhat * gw).sum(-1, keepdim=True) / h) * r64[..., None]
    if residual_out_grad is not None:
        x_grad = x_grad + residual_out_grad.detach().cpu().double()
    w_grad = (xhat * g).reshape(-1, h).sum(0) if weight is not None else torch.zeros(0, dtype=torch.float64)
    return x_grad, w_grad


def forward_bad_inputs(device) -> list[BadInput]:
    x, w = torch.randn(4, 32), torch.randn(32)
    base = (x, w, 1e-6, None, 1.0)

    def call(i, v):
        args = list(base)
        args[i] = v
        return tuple(args)

    return [
        BadInput(call(0, x.half()), r"rms_norm: argument 'x' dtype: expected torch.bfloat16, torch.float32", "dtype"),
        BadInput(call(1, w[:16]), r"argument 'weight' size\(0\) \(H\): expected 32 \(x.size\(-1\)\), got 16", "w"),
        BadInput(call(1, w.double()), r"argument 'weight' dtype: expected torch.float32 \(same as 'x'\)", "w dtype"),
        BadInput(call(2, -1.0), r"argument 'eps' value: expected a non-negative finite float", "eps"),
        BadInput(call(3, x[:2]), r"argument 'residual' shape: expected \[4, 32\]", "residual"),
        BadInput(call(4, float("inf")), r"argument 'out_scale' value: expected a finite float", "scale"),
        BadInput(call(0, x[:, :0]), r"argument 'x' size\(-1\): expected a positive hidden size H", "empty H"),
    ]


def quant_bad_inputs(device) -> list[BadInput]:
    x = torch.randn(4, 32)
    return [
        BadInput((x, None, 1e-6, None, 1.0, 0, False), r"rms_norm_quant: argument 'num_per_channels' value: expected a "
                 r"positive integer, got 0", "npc"),
        BadInput((x.half(), None, 1e-6, None, 1.0, 32, False), r"rms_norm_quant: argument 'x' dtype", "dtype"),
    ]  # fmt: skip


def backward_bad_inputs(device) -> list[BadInput]:
    x, w, g = torch.randn(4, 32), torch.randn(32), torch.randn(4, 32)
    rstd = torch.ones(4)
    return [
        BadInput((g[:3], x, w, rstd, None, 1.0), r"rms_norm_backward: argument 'out_grad' shape", "grad"),
        BadInput((g, x, w, rstd.double(), None, 1.0), r"argument 'rstd' dtype: expected torch.float32", "rstd"),
        BadInput((g, x, w, rstd[:2], None, 1.0), r"argument 'rstd' shape: expected \[4\]", "rstd shape"),
        BadInput((g, x, w, rstd, g.bfloat16(), 1.0), r"argument 'residual_out_grad' dtype", "residual grad"),
    ]


SPECS = [
    OpSpec("rms_norm", forward_samples, forward_reference, forward_bad_inputs, portable.rms_norm),
    OpSpec(
        "rms_norm_quant",
        quant_samples,
        quant_reference,
        quant_bad_inputs,
        portable.rms_norm_quant,
        gradcheck="the inference path: codes carry no gradient (rms_norm is the differentiable form)",
    ),
    OpSpec(
        "rms_norm_backward",
        backward_samples,
        backward_reference,
        backward_bad_inputs,
        portable.rms_norm_backward,
        gradcheck="a backward op (no double backward): its values are checked against autograd in test_norm",
    ),
]
