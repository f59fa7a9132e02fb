"""``quantize_blocks`` on TileKernels' casts (``quant/per_token_cast_kernel.py``, ``per_block_cast_kernel.py``,
``per_channel_cast_kernel.py`` @ 36d9e45): our op is upstream's reference ``tile_kernels.torch.cast`` (amax over the
block's real elements floored at 1e-4 / 6·2^-126, ``sf = amax / max``, multiplier ``max / amax`` or, with ``round_sf``,
``1 / sf`` rounded up to a power of two; RNE codes, E2M1 ties to even), which upstream's tests find bitwise equal to
the kernels. Row-major FP32 scales (upstream's default layout) are our op's output as they come.

Taken: x BF16 or FP32, 2-D with at least one row, a multiple of 64 columns (upstream's tested widths; later releases
assert it), E4M3 or E2M1, ``amax_clamp`` None or the format's default (the kernels floor at their default only), and

* ``[1, c]``, c in 16, 32, 64, 128: ``per_token_cast`` (``_with_precomputed_sf`` with ``sf``): rows of any stride,
  unit column stride, base and row stride 32-byte aligned (SM100's vector loads; SM90's need 16);
* ``[32, 32]``, ``[128, 128]``: ``per_block_cast`` (``_with_precomputed_sf``): contiguous x (its assert);
* ``[128, 1]``, E4M3, rows a multiple of 128, no ``sf``: ``per_channel_cast``: contiguous x.

Refused: E5M6 (36d9e45's ``per_token_cast_to_e5m6`` only: later releases assert E4M3 or E2M1), a row-wide block that
is not one of those widths (36d9e45 takes ``num_per_channels == hidden``, later releases do not), every other block
shape, a given ``sf`` with one block per row (36d9e45's cast-only path asserts ``hidden != num_per_channels``),
FP16/FP64 x, empty x, fake tensors, and (non-finite values, see the package docstring) an x or a given sf's
reciprocal that is not finite (read on the host: their largest magnitude), or any call while a device graph is
captured. With x finite every block's amax is, so its scale and multiplier are (with a given sf: x · (1 / sf) can only
overflow to +-inf, which both sides saturate alike).
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.upstream.tile_kernels import (
    TILE_KERNELS,
    capture_refusal,
    finite_refusal,
    function,
    magnitude,
    real_refusal,
)
from torch_ascend_moe.checks.quant import BLOCK_FORMATS, quantize_blocks_signature

TOKEN_WIDTHS = (16, 32, 64, 128)
SQUARE_BLOCKS = ((32, 32), (128, 128))
ALIGN = 32  # bytes: SM100's vector loads (SM90: 16)


def _plan(x, fmt, block, round_sf, sf, amax_clamp) -> str | tuple[str, tuple]:
    """The upstream function and block for a call, or why none computes it."""
    quantize_blocks_signature(x, fmt, block, round_sf, sf, amax_clamp)
    m, n = x.shape
    why = real_refusal(x, sf)
    if why:
        return why
    if x.dtype not in (torch.bfloat16, torch.float32):
        return f"{x.dtype} x (the library casts BF16 or FP32)"
    if fmt not in ("e4m3", "e2m1"):
        return "E5M6: only the first release casts it (per_token_cast_to_e5m6); later ones assert e4m3 or e2m1"
    if amax_clamp is not None and amax_clamp != BLOCK_FORMATS[fmt][1]:
        return f"amax_clamp {amax_clamp}: the library's casts floor the amax at the format's default only"
    if not (m and n):
        return "an empty x: nothing to hand the library"
    if n % 64:
        return f"{n} columns: the library's casts take a multiple of 64"
    rows, cols = block
    if rows == 1 and cols in TOKEN_WIDTHS:
        if x.stride(1) != 1:
            return "x's columns are not contiguous (the kernel reads rows with unit stride)"
        if x.data_ptr() % ALIGN or (m > 1 and x.stride(0) * x.element_size() % ALIGN):
            return f"x's rows are not {ALIGN}-byte aligned (the kernel's vector loads)"
        if sf is not None and cols == n:
            return "a given sf with one block per row (the first release's cast-only path asserts hidden != block)"
        return "per_token_cast", (1, cols)
    if (rows, cols) in SQUARE_BLOCKS or (rows, cols) == (128, 1):
        if not x.is_contiguous():
            return f"a non-contiguous x (per_{'channel' if cols == 1 else 'block'}_cast asserts a contiguous one)"
        if x.data_ptr() % ALIGN:
            return f"x is not {ALIGN}-byte aligned (the kernel's vector loads)"
        if cols != 1:
            return "per_block_cast", (rows, cols)
        if fmt != "e4m3" or sf is not None or m % 128:
            return "[128, 1] blocks: per_channel_cast takes E4M3, no given sf, rows a multiple of 128"
        return "per_channel_cast", (128, 1)
    return (
        f"blocks {list(block)}: the library casts 1 x 16/32/64/128 (per token), 32 x 32 and 128 x 128 (per block), "
        "128 x 1 (per channel, E4M3)"
    )


def _takes(x, fmt, block, round_sf, sf, amax_clamp):
    plan = _plan(x, fmt, block, round_sf, sf, amax_clamp)
    if isinstance(plan, str):
        return first_refusal(plan)
    why = capture_refusal(x)
    if why is None:
        why = finite_refusal(magnitude(x, None if sf is None else sf.reciprocal()), math.inf, "x or 1 / sf")
    return first_refusal(why)


def cast(x: torch.Tensor, fmt: str, block: tuple, round_sf: bool, sf: torch.Tensor | None, how: str):
    """``(data, sf)`` from the library: codes as our op returns them (E2M1 bytes as uint8), our FP32 scales (a given
    ``sf`` is returned as a copy, as our op does)."""
    if how == "per_channel_cast":
        data, scale = function("quant.per_channel_cast")(x, fmt, block[0], round_sf=round_sf)
    elif sf is not None:
        width = block[1] if how == "per_token_cast" else block
        data = function(f"quant.{how}_with_precomputed_sf")(x, fmt, width, sf.contiguous(), round_sf=round_sf)
        scale = sf.clone()
    else:
        width = block[1] if how == "per_token_cast" else block
        data, scale = function(f"quant.{how}")(x, fmt, width, round_sf=round_sf)
    return (data.view(torch.uint8) if fmt == "e2m1" else data), scale


@kernel(
    device="cuda",
    library="tile_kernels",
    calls="tile_kernels.quant.per_token_cast / per_block_cast / per_channel_cast",
    takes=_takes,
    available=TILE_KERNELS.available,
)
def quantize_blocks(x, fmt, block, round_sf, sf, amax_clamp):
    how, blk = _plan(x, fmt, block, round_sf, sf, amax_clamp)
    return cast(x, fmt, blk, round_sf, sf, how)
