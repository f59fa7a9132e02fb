"""Device-generic rope family: the cache rows gathered per token, then per pair two rounded products and one add or
subtract in FP32 (TileKernels' PyTorch reference's operations; its CUDA kernel fuses one product into the add,
``fma(x1, cos, -(x2 * sin))``, an ulp apart on some lanes: backends/upstream/tile_kernels/rope.py), rounded once to
x's dtype; no host read but the row check. On the CPU the C++ kernel (csrc/ops/rope_cpu.cpp) computes the same
operations with the cache rows read in place, bit for bit these."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks import rope as checks
from torch_ascend_moe.distributed import capture


def cache_rows(args) -> torch.Tensor:
    """``[..., tokens, 1, rot]``: the cache row of each token of x (its positions or its index, plus the offset)."""
    x, cache = args.x, args.cos_sin_cache
    if args.positions is not None:
        rows = args.positions.long() + args.seqlen_offset
    else:
        rows = torch.arange(x.shape[-3], device=x.device) + args.seqlen_offset
    return cache[rows].unsqueeze(-2)


@portable_kernel
def rotary_embedding(args):
    checks.rope_signature(args)
    x = args.x
    if capture.host_readable(x):
        checks.check_rows(args)
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    rot = x.shape[-1]
    table = cache_rows(args)
    cos, sin = table[..., : rot // 2], table[..., rot // 2 :]
    if args.conjugate:
        sin = -sin
    xf = x.to(acc)
    first, second = (xf[..., 0::2], xf[..., 1::2]) if args.interleaved else (xf[..., : rot // 2], xf[..., rot // 2 :])
    y1 = first * cos - second * sin
    y2 = first * sin + second * cos
    if args.interleaved:
        out = torch.stack([y1, y2], dim=-1).flatten(-2)
    else:
        out = torch.cat([y1, y2], dim=-1)
    return out.to(x.dtype)
