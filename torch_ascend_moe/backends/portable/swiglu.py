"""Device-generic swiglu family: TileKernels' SwiGLU forward / backward (its ``tile_kernels.torch`` references'
operations in their order, so FP32 results are theirs bit for bit on the same device) over the psum layout, plus
quantize_blocks' per-token cast. Rows outside the layout are masked on the device (no host read but the layout
check), so the kernels are capturable. On the CPU the C++ kernels (csrc/ops/swiglu_cpu.cpp) compute the same
operations in one pass, bit for bit these."""

from __future__ import annotations

import torch

from torch_ascend_moe._arith import fma
from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.backends.portable.quant import tile_cast
from torch_ascend_moe.checks import swiglu as checks
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.quant.encodings import E4M3_AMAX_FLOOR
from torch_ascend_moe.quant.reference import dequantized


def layout_rows(psum: torch.Tensor | None, alignment: int, rows: int, device) -> torch.Tensor | None:
    """Bool ``[N]``: the rows some expert owns in the psum layout (None: every row)."""
    if psum is None:
        return None
    if psum.numel() == 0:
        return torch.zeros(rows, dtype=torch.bool, device=device)
    ends = psum.long()
    starts = (torch.cat([ends.new_zeros(1), ends[:-1]]) + alignment - 1) // alignment * alignment
    r = torch.arange(rows, device=device)
    # The last expert starting at or before the row owns it if any does: a nonempty expert's successors start
    # after its end, so only empty experts share a start.
    e = torch.searchsorted(starts, r, right=True) - 1
    return (e >= 0) & (r < ends[e.clamp(min=0)])


def _halves(xf: torch.Tensor, h: int, clamp_value):
    a, b = xf[:, :h], xf[:, h:]
    if clamp_value is None:
        return a, b, None, None
    return torch.clamp(a, max=clamp_value), torch.clamp(b, min=-clamp_value, max=clamp_value), a, b


def _weights(args, rows: torch.Tensor | None, acc: torch.dtype):
    w = args.topk_weights
    if w is None:
        return None
    w = w.to(acc)
    if args.routed_scaling_factor is not None:
        w = w * args.routed_scaling_factor
    return w if rows is None else torch.where(rows, w, 0)


def clamp_counts(a: torch.Tensor, b: torch.Tensor, c: float, rows: torch.Tensor | None) -> torch.Tensor:
    """int64 ``[4]``: #(a > c), #(b > c), #(b < -c) over the layout's rows, and those rows' element count."""
    flags = (a > c, b > c, b < -c)
    if rows is None:
        return torch.stack([torch.count_nonzero(f) for f in flags] + [a.new_tensor(a.numel(), dtype=torch.int64)])
    per_row = torch.stack([torch.count_nonzero(f, dim=1) for f in flags])  # [3, N], then keep the layout's rows
    return torch.cat([(per_row * rows).sum(1), (rows.sum() * a.shape[1]).reshape(1)])


@portable_kernel
def swiglu_forward(args):
    checks.forward_signature(args)
    x = args.x
    n, h = x.shape[0], x.shape[1] // 2
    if capture.host_readable(x):
        checks.check_layout_values(checks.FORWARD, args.psum_num_tokens_per_expert, args.alignment, n)
    acc = checks.compute_dtype(x)
    rows = layout_rows(args.psum_num_tokens_per_expert, args.alignment, n, x.device)
    a, b, a_in, b_in = _halves(x.to(acc), h, args.clamp_value)
    count = torch.zeros(4, dtype=torch.int64, device=x.device)
    if args.clamp_value is not None:
        count = clamp_counts(a_in, b_in, args.clamp_value, rows)
    y = a / (1.0 + torch.exp(-a)) * b
    w = _weights(args, rows, acc)
    if w is not None:
        y = y * w[:, None]
    if rows is not None:
        y = torch.where(rows[:, None], y, 0)
    out_dtype = checks.forward_out_dtype(args)
    if out_dtype != checks.FP8:
        return y.to(out_dtype), x.new_empty([0], dtype=torch.float32), count
    floor = E4M3_AMAX_FLOOR if args.sf_clamp_min is None else args.sf_clamp_min
    data, sf = tile_cast(y.float(), "e4m3", [1, args.num_per_channels], args.round_sf, None, floor)
    return data, sf, count


def dequantized_x(args, acc: torch.dtype) -> torch.Tensor:
    """x in the compute dtype; E4M3 codes times their block scale (one FP32 product each)."""
    x = args.x
    if x.dtype != checks.FP8:
        return x.to(acc)
    return dequantized(x, args.x_sf, (1, checks.x_scale_block(args))).to(acc)


@portable_kernel
def swiglu_backward(args):
    n, h, out_dtype, sf_cols = checks.backward_signature(args)
    g_in = args.grad_out
    if capture.host_readable(g_in):
        checks.check_layout_values(checks.BACKWARD, args.psum_num_tokens_per_expert, args.alignment, n)
    acc = checks.compute_dtype(args.x, g_in)
    rows = layout_rows(args.psum_num_tokens_per_expert, args.alignment, n, g_in.device)
    a, b, a_in, b_in = _halves(dequantized_x(args, acc), h, args.clamp_value)
    t = 1.0 + torch.exp(-a)
    s = torch.ones_like(a) / t
    g = g_in.to(acc)
    w = _weights(args, rows, acc)
    gws = g * s if w is None else g * w[:, None] * s
    da = gws * b * fma(a, 1.0 - s, 1.0)
    db = gws * a
    if args.clamp_value is not None:
        c = args.clamp_value
        da = torch.where(a_in > c, 0.0, da)
        db = torch.where((b_in > c) | (b_in < -c), 0.0, db)
    act = a / t * b
    out = act if w is None else act * w[:, None]
    x_grad = torch.cat([da, db], dim=1)
    if rows is not None:
        x_grad = torch.where(rows[:, None], x_grad, 0)
        out = torch.where(rows[:, None], out, 0)
    if w is None:
        weight_grad = g_in.new_empty([0], dtype=acc)
    else:
        weight_grad = (g * act).sum(dim=1)
        if rows is not None:
            weight_grad = torch.where(rows, weight_grad, 0)
        if args.routed_scaling_factor is not None:
            weight_grad = weight_grad * args.routed_scaling_factor
    if sf_cols is None:
        q, sf = g_in.new_empty([0], dtype=checks.FP8), g_in.new_empty([0], dtype=torch.float32)
    else:
        q, sf = tile_cast(x_grad.float(), "e4m3", [1, args.num_per_channels], args.round_sf, None, E4M3_AMAX_FLOOR)
    return x_grad.to(out_dtype), q, sf, weight_grad, out.to(out_dtype)
