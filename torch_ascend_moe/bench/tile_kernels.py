"""Benchmark cases of TileKernels' ops (the swiglu, norm, rope and moe_gate families) against the unfused torch
compositions a model would write for the same results: SwiGLU then the per-token cast (``quantize_fp8``'s C++ kernel),
the SwiGLU backward by autograd, RMSNorm with a residual (``torch.nn.functional.rms_norm``), RoPE with gathered
cos/sin, the sqrt-softplus gate by sort and gather. On CPU each of ours is a C++ kernel (one pass per chunk of rows;
the gate: a top-k list per row instead of a sort) with the portable kernel's bits."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.moe_gate import moe_topk_gate
from torch_ascend_moe.ops.norm import rms_norm
from torch_ascend_moe.ops.quant import quantize_fp8
from torch_ascend_moe.ops.rope import rotary_embedding
from torch_ascend_moe.ops.swiglu import swiglu_backward, swiglu_forward


def _swiglu(rows: int, hidden: int) -> Case:
    def setup():
        x = torch.randn(rows, 2 * hidden).bfloat16()
        w = torch.rand(rows)

        def ours():
            return swiglu_forward(x, w, clamp_value=10.0, out_dtype=torch.float8_e4m3fn, num_per_channels=128)

        def unfused():
            a, b = x.float().chunk(2, dim=1)
            y = F.silu(a.clamp(max=10.0)) * b.clamp(-10.0, 10.0) * w[:, None]
            return quantize_fp8(y, [1, 128])

        return ours, unfused

    return Case(f"SwiGLU + E4M3 cast {rows}x{hidden}", 5 * rows * hidden, setup, "silu·mul + quantize_fp8")


def _swiglu_backward(rows: int, hidden: int) -> Case:
    def setup():
        x = torch.randn(rows, 2 * hidden).bfloat16()
        w, g = torch.rand(rows), torch.randn(rows, hidden).bfloat16()

        def ours():
            return swiglu_backward(x, g, w, clamp_value=10.0)

        def unfused():
            xr, wr = x.float().requires_grad_(), w.requires_grad_()
            a, b = xr.chunk(2, dim=1)
            y = F.silu(a.clamp(max=10.0)) * b.clamp(-10.0, 10.0) * wr[:, None]
            return torch.autograd.grad(y, (xr, wr), g.float())

        return ours, unfused

    return Case(f"SwiGLU backward {rows}x{hidden}", 14 * rows * hidden, setup, "autograd of silu·mul", grad=True)


def _rms_norm(rows: int, hidden: int) -> Case:
    def setup():
        x, r = torch.randn(rows, hidden).bfloat16(), torch.randn(rows, hidden).bfloat16()
        w = torch.randn(hidden).bfloat16()
        return (lambda: rms_norm(x, w, residual=r)), (lambda: F.rms_norm(x + r, (hidden,), w, 1e-6))

    return Case(f"RMSNorm + residual BF16 {rows}x{hidden}", 4 * rows * hidden, setup, "F.rms_norm(x + r)")


def _rope(tokens: int, heads: int, rot: int) -> Case:
    def setup():
        x = torch.randn(tokens, heads, rot).bfloat16()
        angle = torch.rand(4096, rot // 2) * 6.3
        cache = torch.cat([angle.cos(), angle.sin()], 1)
        pos = torch.randint(0, 4096, (tokens,))

        def unfused():
            cos, sin = cache[pos, None, : rot // 2], cache[pos, None, rot // 2 :]
            x1, x2 = x.float().chunk(2, dim=-1)
            return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).bfloat16()

        return (lambda: rotary_embedding(x, cache, pos)), unfused

    return Case(f"RoPE BF16 {tokens}x{heads}x{rot}", 3 * tokens * heads * rot, setup, "gather + cos/sin math")


def _gate(tokens: int, experts: int, k: int) -> Case:
    def setup():
        logits, bias = torch.randn(tokens, experts), torch.randn(experts) * 0.1

        def unfused():
            u = F.softplus(logits).sqrt()
            idx = torch.sort(u + bias, dim=1, descending=True, stable=True).indices[:, :k]
            s = u.gather(1, idx)
            return idx, s / (s.sum(-1, keepdim=True) + 1e-20) * 2.5

        def ours():
            return moe_topk_gate(logits, bias, k, scoring_func="sqrtsoftplus", routed_scaling_factor=2.5,
                                 clamp_denominator=False)  # fmt: skip

        return ours, unfused

    return Case(f"sqrt-softplus gate {tokens}x{experts} k{k}", 4 * tokens * experts, setup, "softplus·sort·gather")


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [_swiglu(64, 256), _swiglu_backward(64, 256), _rms_norm(64, 512), _rope(64, 4, 64), _gate(64, 64, 6)]
    return [
        _swiglu(4096, 2048),
        _swiglu_backward(4096, 2048),
        _rms_norm(4096, 7168),
        _rope(4096, 16, 128),
        _gate(4096, 256, 8),
    ]
