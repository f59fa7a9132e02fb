"""``rotary_embedding`` on the later releases' ``transform.apply_rotary`` (``transform/rope_kernel.py`` and
``rope_cuda.py`` @ 446345f; absent from the first release 36d9e45: refused there with that reason), run in place on a
contiguous copy of x (our op returns a new tensor).

Per pair the kernel computes ``x1·cos − x2·sin`` and ``x1·sin + x2·cos`` in FP32 with a fused multiply-add
(``ieee_fmaf(x1, cos, -(x2·sin))``), rounded once to x's dtype; our op rounds both products (two roundings, then the
sum), so results are within the op's tolerance of ours, not bitwise (an FP32 output can differ in its last bit; a BF16
one rarely). The cache row is ``int32(seqlen_offset) + position`` (or the token's index), read without a bounds
check: our op's row check runs first (a host read, as the portable kernel's); while a device graph is captured the
rows are clamped into the cache on the device instead, so no read leaves it.

Taken: BF16/FP32 x (FP64 stays portable), a rotary dim of 32, 64, 128 or 256 (the CUDA kernel's), at least one
token, a cache of fewer than 2^31 rows and an offset below 2^31 (the kernel's positions are int32).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.upstream.tile_kernels import (
    FIRST_RELEASE,
    TILE_KERNELS,
    function,
    missing,
    real_refusal,
)
from torch_ascend_moe.checks import rope as checks
from torch_ascend_moe.distributed import capture

ROTARY_DIMS = (32, 64, 128, 256)
INT32_ROWS = 2**31


def _takes(args):
    checks.rope_signature(args)
    x, cache = args.x, args.cos_sin_cache
    why = real_refusal(x, cache, args.positions) or missing("transform.apply_rotary", FIRST_RELEASE)
    if why is None and x.dtype not in (torch.bfloat16, torch.float32):
        why = f"{x.dtype} x (the kernel rotates FP16, BF16 or FP32; our op has no FP16)"
    if why is None and x.shape[-1] not in ROTARY_DIMS:
        why = f"a rotary dim of {x.shape[-1]} (the CUDA kernel takes 32, 64, 128 or 256)"
    if why is None and x.numel() == 0:
        why = "no tokens: nothing to hand the library"
    if why is None and (cache.shape[0] >= INT32_ROWS or args.seqlen_offset >= INT32_ROWS):
        why = "cache rows or seqlen_offset beyond int32 (the kernel's positions are int32)"
    return first_refusal(why)


@kernel(
    device="cuda",
    library="tile_kernels",
    calls="tile_kernels.transform.apply_rotary",
    takes=_takes,
    available=TILE_KERNELS.available,
)
def rotary_embedding(args):
    x, cache, positions, offset = args.x, args.cos_sin_cache, args.positions, args.seqlen_offset
    if capture.host_readable(x):
        checks.check_rows(args)
    elif positions is not None:  # no host read while capturing: every row inside the cache
        positions, offset = (positions.long() + offset).clamp(0, cache.shape[0] - 1), 0
    out = x.clone(memory_format=torch.contiguous_format)
    function("transform.apply_rotary")(
        out, cache if cache.stride(1) == 1 else cache.contiguous(), positions=None if positions is None else
        positions.contiguous(), interleaved=args.interleaved, conjugate=args.conjugate, seqlen_offset=offset,
    )  # fmt: skip
    return out
