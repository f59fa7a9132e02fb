"""``tile_kernels.transform`` of the later release (deepseek-ai/TileKernels @ 446345f: ``transform/rope_kernel.py``,
``transform/rope_cuda.py``), CUDA path: ``apply_rotary`` in place, upstream's asserts in its order, the kernel's
arithmetic per pair in FP32 with fused multiply-adds (``T.ieee_fmaf``): ``fma(x1, cos, -(x2 · sin))`` and ``fma(x1,
sin, x2 · cos)`` (``conjugate``: ``fma(x1, cos, x2 · sin)``, ``fma(x1, -sin, x2 · cos)``), rounded once to x's dtype;
the cache row ``int32(seqlen_offset) + positions[b, t]`` (or ``+ t``), read without a bounds check (``Panic``).
Absent from the package while it imitates 36d9e45."""

from __future__ import annotations

import torch

from tile_kernels._fma import fma
from tile_kernels._standin import Panic, check, record

RK = "tile_kernels/transform/rope_kernel.py"


def _rotate(x: torch.Tensor, cache: torch.Tensor, positions, seqlen_offset: int, interleaved: bool, conjugate: bool):
    batch, seqlen, heads, rot = x.shape
    if batch > 1:
        check(x.stride(0) % 8 == 0, RK, "batch_is_one or x.stride(0) % 8 == 0")
    if positions is None:
        rows = torch.arange(seqlen).expand(batch, seqlen) + seqlen_offset
    else:
        rows = positions.long() + seqlen_offset
    rows = ((rows + 2**31) % 2**32) - 2**31  # int32 arithmetic
    if bool(((rows < 0) | (rows >= cache.shape[0])).any()):
        raise Panic("a cache row past cos_sin_cache: the kernel reads out of bounds")
    table = cache[rows].unsqueeze(-2)  # [batch, seqlen, 1, rot]
    cos, sin = table[..., : rot // 2], table[..., rot // 2 :]
    xf = x.float()
    first, second = (xf[..., 0::2], xf[..., 1::2]) if interleaved else (xf[..., : rot // 2], xf[..., rot // 2 :])
    if conjugate:
        y1, y2 = fma(first, cos, second * sin), fma(first, -sin, second * cos)
    else:
        y1, y2 = fma(first, cos, -(second * sin)), fma(first, sin, second * cos)
    out = torch.stack([y1, y2], dim=-1).flatten(-2) if interleaved else torch.cat([y1, y2], dim=-1)
    x.copy_(out.to(x.dtype))


def apply_rotary(query: torch.Tensor, cos_sin_cache: torch.Tensor, key=None, positions=None, interleaved: bool = False,
                 conjugate: bool = False, seqlen_offset: int = 0) -> None:  # fmt: skip
    record("apply_rotary", query=query, cos_sin_cache=cos_sin_cache, key=key, positions=positions,
           interleaved=interleaved, conjugate=conjugate, seqlen_offset=seqlen_offset)  # fmt: skip
    check(query.ndim in (3, 4), RK, "query.ndim in (3, 4)")
    check(isinstance(seqlen_offset, int), RK, "isinstance(seqlen_offset, int)")
    if key is not None:
        check(key.ndim == query.ndim, RK, "key.ndim == query.ndim")
    check(cos_sin_cache.ndim == 2, RK, "cos_sin_cache.ndim == 2")
    if query.ndim == 3:
        if positions is not None:
            check(positions.shape == (query.shape[0],), RK, "positions.shape == (seqlen,)")
            positions = positions.unsqueeze(0)
        query = query.unsqueeze(0)
        key = None if key is None else key.unsqueeze(0)
    elif positions is not None:
        check(positions.shape == tuple(query.shape[:2]), RK, "positions.shape == (batch, seqlen)")
    rot = cos_sin_cache.shape[1]
    check(rot in (32, 64, 128, 256), RK, "rot_dim in (32, 64, 128, 256)")
    check(query.shape[-1] == rot, RK, "query.shape[-1] == rot_dim")
    check(query.stride(-1) == 1, RK, "query.stride(-1) == 1")
    check(cos_sin_cache.dtype == torch.float32, RK, "cos_sin_cache.dtype == torch.float32")
    check(cos_sin_cache.stride(1) == 1, RK, "cos_sin_cache.stride(1) == 1")
    check(query.dtype in (torch.float16, torch.bfloat16, torch.float32), RK,
          "query.dtype in (torch.float16, torch.bfloat16, torch.float32)")  # fmt: skip
    check(positions is None or positions.dtype in (torch.int32, torch.int64), RK,
          "positions is None or positions.dtype in (torch.int32, torch.int64)")  # fmt: skip
    check(positions is None or positions.stride(-1) == 1, RK, "positions is None or positions.stride(-1) == 1")
    if key is not None:
        check(key.shape[-1] == rot, RK, "key.shape[-1] == rot_dim")
        check(key.dtype == query.dtype, RK, "key.dtype == query.dtype")
        check(key.stride(-1) == 1, RK, "key.stride(-1) == 1")
    for x in (query, key):
        if x is not None and x.numel():
            _rotate(x, cos_sin_cache, positions, seqlen_offset, interleaved, conjugate)
