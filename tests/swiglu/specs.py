"""Sample inputs, references, bad inputs and the harness specs of the swiglu family.

Shapes are TileKernels' test pattern scaled for a CPU: a few dozen expanded rows in DeepGEMM's psum layout (experts
with no rows, alignment padding), hidden sizes that are multiples of 32, clamps 0.5 and 10 (most elements clamped,
few), routing weights with a scaling factor, and the per-token E4M3 cast in blocks of 32 or a whole row.

The references are the spec's formulas (specs/tilekernels_deepselect.md §6, §10.6): values in FP64, the layout's
rows by a Python walk over ``psum``. Where an output is an E4M3 cast, its input is the FP32 result in the spec's
operation order (what TileKernels casts; its fused multiply-add rounded once, computed exactly with fractions) and
the cast is ``tests/quant/specs.py``'s element-by-element reference.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch

from tests.quant.specs import quantize_blocks_reference
from torch_ascend_moe.backends.portable import swiglu as portable
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

FP8 = torch.float8_e4m3fn

# (rows, H, experts (0: no layout), alignment, weights, scale, clamp, output ("same", None or an E4M3 block), round_sf)
_CASES = [
    (37, 96, 4, 8, True, 2.5, 0.5, None, False),
    (29, 64, 0, 1, False, None, None, "same", False),
    (33, 64, 0, 1, True, None, 10.0, 32, True),
    (40, 64, 5, 16, True, 1.5, 10.0, "row", False),
    (0, 32, 2, 4, True, None, 0.5, 32, False),
]
_CASES_SMALL = [
    (9, 8, 3, 4, True, 2.0, 0.5, None, False),
    (6, 8, 0, 1, False, None, None, 4, True),
]


def layout(rows: int, experts: int, alignment: int, g) -> torch.Tensor | None:
    """A psum layout over ``rows`` rows: random expert sizes (some 0), each start aligned; None without experts."""
    if not experts:
        return None
    ends, end = [], 0
    for e in range(experts):
        start = -(-end // alignment) * alignment
        room = max(rows - start, 0)
        size = 0 if e == 1 else int(torch.randint(0, room + 1, (1,), generator=g)) if e < experts - 1 else room
        end = min(start + size, rows) if room else end
        ends.append(end)
    return torch.tensor(ends, dtype=torch.int32)


def layout_mask(psum, alignment: int, rows: int) -> torch.Tensor:
    """The rows some expert owns, by walking the layout."""
    mask = torch.zeros(rows, dtype=torch.bool)
    if psum is None:
        return mask.logical_not_()
    prev = 0
    for end in psum.tolist():
        start = -(-prev // alignment) * alignment
        mask[start:end] = True
        prev = end
    return mask


def _out_dtype(output, dtype):
    if output is None:
        return None
    if output == "same":
        return dtype
    return FP8


def forward_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(5)
    out = []
    for rows, h, experts, alignment, weighted, scale, clamp, output, round_sf in _CASES_SMALL if small else _CASES:
        x = (torch.randn(rows, 2 * h, generator=g, dtype=torch.float64) * 3).to(dtype)
        w = torch.rand(rows, generator=g, dtype=torch.float64).to(
            torch.float64 if dtype == torch.float64 else torch.float32
        )
        psum = layout(rows, experts, alignment, g)
        out_dtype = _out_dtype(output, dtype)
        npc = h if output == "row" else output if isinstance(output, int) else 128
        if out_dtype == FP8 and (dtype == torch.float64 or requires_grad):
            out_dtype = None  # gradient checks: the differentiable output (codes are not)
        args = (
            x.to(device).requires_grad_(requires_grad),
            w.to(device).requires_grad_(requires_grad) if weighted else None,
            None if psum is None else psum.to(device),
            alignment, scale, clamp, out_dtype, npc, round_sf, None,
        )  # fmt: skip
        name = f"N{rows} H{h} E{experts}/{alignment} w{weighted} s{scale} c{clamp} {out_dtype} {npc}"
        out.append(SampleInput(args, name))
    return out


def _halves64(x: torch.Tensor, clamp):
    h = x.shape[1] // 2
    a, b = x[:, :h], x[:, h:]
    if clamp is None:
        return a, b, torch.zeros_like(a, dtype=torch.bool), torch.zeros_like(b, dtype=torch.bool)
    return a.clamp(max=clamp), b.clamp(-clamp, clamp), a > clamp, (b > clamp) | (b < -clamp)


def _weights(w, scale, mask, dtype):
    """The routing weight per row (FP32 arithmetic as the kernels: the scaled weight is rounded once)."""
    if w is None:
        return None
    w = w.detach().cpu()
    if scale is not None:
        w = w * scale
    return torch.where(mask, w.to(dtype), 0)


def forward_fp32(x, w, psum, alignment, scale, clamp) -> torch.Tensor:
    """The FP32 output in the spec's operation order (what the per-token cast takes)."""
    x = x.detach().cpu().float()
    mask = layout_mask(psum, alignment, x.shape[0])
    h = x.shape[1] // 2
    a, b = x[:, :h], x[:, h:]
    if clamp is not None:
        a, b = a.clamp(max=clamp), b.clamp(-clamp, clamp)
    y = a / (1.0 + torch.exp(-a)) * b
    wf = _weights(w, scale, mask, torch.float32)
    if wf is not None:
        y = y * wf[:, None]
    return torch.where(mask[:, None], y, 0)


def forward_reference(x, topk_weights, psum, alignment, scale, clamp, out_dtype, npc, round_sf, sf_clamp_min):
    rows, h = x.shape[0], x.shape[1] // 2
    mask = layout_mask(psum, alignment, rows)
    x64 = x.detach().cpu().double()
    counts = torch.zeros(4, dtype=torch.int64)
    if clamp is not None:
        a, b = x64[:, :h][mask], x64[:, h:][mask]
        counts = torch.tensor([int((a > clamp).sum()), int((b > clamp).sum()), int((b < -clamp).sum()),
                               int(mask.sum()) * h])  # fmt: skip
    if out_dtype == FP8:
        y = forward_fp32(x, topk_weights, psum, alignment, scale, clamp)
        data, sf = quantize_blocks_reference(y, "e4m3", [1, npc], round_sf, None, sf_clamp_min)
        return data, sf, counts
    a, b, _, _ = _halves64(x64, clamp)
    y = a * torch.sigmoid(a) * b
    w = _weights(topk_weights, scale, mask, torch.float64)
    if w is not None:
        y = y * w[:, None]
    return torch.where(mask[:, None], y, 0), torch.zeros(0, dtype=torch.float64), counts


def backward_samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(6)
    out = []
    cases = _CASES_SMALL if small else _CASES
    for i, (rows, h, experts, alignment, weighted, scale, clamp, output, round_sf) in enumerate(cases):
        x = torch.randn(rows, 2 * h, generator=g, dtype=torch.float64) * 3
        x_sf = None
        if i % 2 == 1:  # E4M3 inputs with power-of-two block scales (products exact in FP32 and FP64 alike)
            block = 8 if small else 32
            x_sf = 2.0 ** torch.randint(-3, 3, (rows, 2 * h // block), generator=g).float()
            x = (x / x_sf.double().repeat_interleave(block, 1)).clamp(-448, 448).to(FP8)
        else:
            x = x.to(dtype)
        grad = torch.randn(rows, h, generator=g, dtype=torch.float64).to(dtype)
        w = torch.rand(rows, generator=g, dtype=torch.float64).to(
            torch.float64 if dtype == torch.float64 else torch.float32
        )
        psum = layout(rows, experts, alignment, g)
        npc = 0 if output in (None, "same") or dtype == torch.float64 else (2 * h if output == "row" else output)
        out_dtype = torch.float32 if output == "same" and dtype != torch.float64 else None
        args = (
            x.to(device).requires_grad_(requires_grad and x.dtype != FP8),
            None if x_sf is None else x_sf.to(device),
            grad.to(device).requires_grad_(requires_grad),
            w.to(device).requires_grad_(requires_grad) if weighted else None,
            None if psum is None else psum.to(device),
            alignment, scale, clamp, out_dtype, npc, round_sf,
        )  # fmt: skip
        name = f"N{rows} H{h} {x.dtype} E{experts}/{alignment} w{weighted} s{scale} c{clamp} {out_dtype} npc{npc}"
        out.append(SampleInput(args, name))
    return out


def _dequantized(x, x_sf, dtype) -> torch.Tensor:
    x = x.detach().cpu()
    if x_sf is None:
        return x.to(dtype)
    block = x.shape[1] // x_sf.shape[1]
    return (x.float() * x_sf.cpu().repeat_interleave(block, 1)).to(dtype)


def fma_f32(a: float, b: float, c: float) -> np.float32:
    """``a * b + c`` rounded once to FP32, computed exactly: the FP32 neighbour nearest the exact rational,
    ties to the even mantissa."""
    if not all(np.isfinite([a, b, c])):  # infinities and NaN propagate through one rounding or two alike
        return np.float32(a * b + c)
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    guess = np.float32(float(exact))
    best = None
    for cand in (np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))):
        key = (abs(Fraction(float(cand)) - exact), int(np.array(cand).view(np.int32)) & 1)
        if best is None or key < best[0]:
            best = (key, cand)
    return best[1]


def backward_fp32_x_grad(x, x_sf, grad_out, w, psum, alignment, scale, clamp) -> torch.Tensor:
    """The FP32 input gradient in the spec's operation order (what its per-token cast takes)."""
    xf = _dequantized(x, x_sf, torch.float32)
    rows = xf.shape[0]
    mask = layout_mask(psum, alignment, rows)
    a, b, a_clamped, b_clamped = _halves64(xf, clamp)
    t = 1.0 + torch.exp(-a)
    s = torch.ones_like(a) / t
    g = grad_out.detach().cpu().float()
    wf = _weights(w, scale, mask, torch.float32)
    gws = g * s if wf is None else g * wf[:, None] * s
    one_minus = 1.0 - s
    inner = torch.tensor(
        [fma_f32(p, q, 1.0) for p, q in zip(a.flatten().tolist(), one_minus.flatten().tolist())], dtype=torch.float32
    ).view(a.shape)
    da = torch.where(a_clamped, 0.0, gws * b * inner)
    db = torch.where(b_clamped, 0.0, gws * a)
    return torch.where(mask[:, None], torch.cat([da, db], 1), 0)


def backward_reference(x, x_sf, grad_out, topk_weights, psum, alignment, scale, clamp, out_dtype, npc, round_sf):
    rows = x.shape[0]
    mask = layout_mask(psum, alignment, rows)
    a, b, a_clamped, b_clamped = _halves64(_dequantized(x, x_sf, torch.float64), clamp)
    s = torch.sigmoid(a)
    g = grad_out.detach().cpu().double()
    w = _weights(topk_weights, scale, mask, torch.float64)
    gw = g if w is None else g * w[:, None]
    da = torch.where(a_clamped, 0.0, gw * s * b * (1 + a * (1 - s)))
    db = torch.where(b_clamped, 0.0, gw * s * a)
    act = a * s * b
    x_grad = torch.where(mask[:, None], torch.cat([da, db], 1), 0)
    out = torch.where(mask[:, None], act if w is None else act * w[:, None], 0)
    if topk_weights is None:
        weight_grad = torch.zeros(0, dtype=torch.float64)
    else:
        weight_grad = torch.where(mask, (g * act).sum(1), 0) * (1.0 if scale is None else scale)
    if npc:
        fp32 = backward_fp32_x_grad(x, x_sf, grad_out, topk_weights, psum, alignment, scale, clamp)
        q, sf = quantize_blocks_reference(fp32, "e4m3", [1, npc], round_sf, None, None)
    else:
        q, sf = torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.float64)
    return x_grad, q, sf, weight_grad, out


def forward_bad_inputs(device) -> list[BadInput]:
    x, w = torch.randn(8, 16), torch.rand(8)
    psum = torch.tensor([3, 8], dtype=torch.int32)

    def call(**kw):
        names = ["x", "topk_weights", "psum_num_tokens_per_expert", "alignment", "routed_scaling_factor",
                 "clamp_value", "out_dtype", "num_per_channels", "round_sf", "sf_clamp_min"]  # fmt: skip
        args = dict(zip(names, [x, w, psum, 4, None, None, None, 128, False, None]))
        args.update(kw)
        return tuple(args.values())

    return [
        BadInput(call(x=x.half()), r"swiglu_forward: argument 'x' dtype: expected torch.bfloat16, ", "dtype"),
        BadInput(call(x=x[:, :15]), r"argument 'x' size\(1\): expected an even number 2H > 0", "odd"),
        BadInput(call(x=x[0]), r"argument 'x' rank: expected 2-D \[N, 2H\]", "rank"),
        BadInput(call(topk_weights=w[:5]), r"argument 'topk_weights' size\(0\) \(N\): expected 8", "weights"),
        BadInput(call(topk_weights=w.double()), r"argument 'topk_weights' dtype: expected torch.float32", "w dtype"),
        BadInput(call(psum_num_tokens_per_expert=psum.long()), r"'psum_num_tokens_per_expert' dtype", "psum dtype"),
        BadInput(call(alignment=0), r"argument 'alignment' value: expected a positive integer, got 0", "alignment"),
        BadInput(
            call(topk_weights=None, routed_scaling_factor=2.0),
            r"argument 'routed_scaling_factor' presence: expected None without 'topk_weights'",
            "scale",
        ),
        BadInput(call(clamp_value=-1.0), r"argument 'clamp_value' value: expected None or a positive finite", "clamp"),
        BadInput(call(out_dtype=torch.int8), r"argument 'out_dtype' value: expected None, torch.float32", "out"),
        BadInput(call(out_dtype=FP8, num_per_channels=0), r"'num_per_channels' value: expected a positive", "npc"),
        BadInput(
            call(psum_num_tokens_per_expert=torch.tensor([5, 3], dtype=torch.int32)),
            r"argument 'psum_num_tokens_per_expert' values: expected nondecreasing cumulative expert ends",
            "psum values",
            data_dependent=True,
        ),
    ]


def backward_bad_inputs(device) -> list[BadInput]:
    x, g, w = torch.randn(8, 16), torch.randn(8, 8), torch.rand(8)
    q, sf = x.to(FP8), torch.ones(8, 2)

    def call(**kw):
        names = ["x", "x_sf", "grad_out", "topk_weights", "psum_num_tokens_per_expert", "alignment",
                 "routed_scaling_factor", "clamp_value", "out_dtype", "num_per_channels", "round_sf"]  # fmt: skip
        args = dict(zip(names, [x, None, g, w, None, 1, None, None, None, 0, False]))
        args.update(kw)
        return tuple(args.values())

    return [
        BadInput(call(grad_out=g[:, :4]), r"swiglu_backward: argument 'grad_out' shape: expected \[8, 8\]", "grad"),
        BadInput(call(x=q), r"argument 'x_sf' presence: expected given with an E4M3 x", "no sf"),
        BadInput(call(x_sf=sf), r"argument 'x_sf' presence: expected None for a torch.float32 x", "sf"),
        BadInput(call(x=q, x_sf=torch.ones(8, 3)), r"argument 'x_sf' size\(1\): expected a divisor of 2H=16", "blk"),
        BadInput(call(x=q, x_sf=sf.double()), r"argument 'x_sf' dtype: expected torch.float32", "sf dtype"),
        BadInput(call(out_dtype=FP8), r"argument 'out_dtype' value: expected None or torch.bfloat16", "out"),
        BadInput(call(num_per_channels=-1), r"'num_per_channels' value: expected a non-negative integer", "npc"),
        BadInput(call(grad_out=g.half()), r"argument 'grad_out' dtype: expected torch.bfloat16", "grad dtype"),
    ]


_DIFFERENTIABLE = "a backward op (no double backward): its values are checked against autograd in test_swiglu"

SPECS = [
    OpSpec(
        "swiglu_forward",
        forward_samples,
        forward_reference,
        forward_bad_inputs,
        portable.swiglu_forward,
    ),
    OpSpec(
        "swiglu_backward",
        backward_samples,
        backward_reference,
        backward_bad_inputs,
        portable.swiglu_backward,
        gradcheck=_DIFFERENTIABLE,
    ),
]
