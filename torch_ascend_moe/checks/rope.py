"""The rope family's argument checks (``rotary_embedding``). Twin: ``csrc/ops/rope_checks.h`` (the same checks
in the same order, the same words; tests/test_validation_twins.py compares them)."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

OP = "ascend_moe::rotary_embedding"
DTYPES = (torch.bfloat16, torch.float32, torch.float64)


def rope_signature(args) -> None:
    x, cache, positions = args.x, args.cos_sin_cache, args.positions
    ck.check_arg(
        x.dim() in (3, 4), OP, "x", "rank", "3-D [T, heads, rot] or 4-D [B, S, heads, rot]", lambda: f"{x.dim()}-D"
    )
    ck.check_arg(x.dtype in DTYPES, OP, "x", "dtype", "torch.bfloat16, torch.float32 or torch.float64", x.dtype)
    ck.check_rank(OP, "cos_sin_cache", cache, 2, "[rows, rot] (cos halves, then sin halves)")
    want = torch.float64 if x.dtype == torch.float64 else torch.float32
    ck.check_arg(cache.dtype == want, OP, "cos_sin_cache", "dtype", want, cache.dtype)
    ck.check_arg(
        cache.device == x.device, OP, "cos_sin_cache", "device", lambda: f"{x.device} (same as 'x')", cache.device
    )
    rot = cache.shape[1]
    ck.check_arg(rot % 2 == 0 and rot > 0, OP, "cos_sin_cache", "size(1)", "an even rotary dim > 0", lambda: rot)
    ck.check_dim_size(OP, "x", x, x.dim() - 1, "rot", rot, "cos_sin_cache.size(1)")
    ck.check_int_arg(OP, "seqlen_offset", args.seqlen_offset, 0)
    if positions is None:
        need = args.seqlen_offset + x.shape[-3]
        ck.check_arg(
            need <= cache.shape[0],
            OP,
            "cos_sin_cache",
            "size(0)",
            lambda: f"at least seqlen_offset + tokens = {ck._text(need)}",
            lambda: cache.shape[0],
        )
    else:
        rows = list(x.shape[:-2])
        ck.check_arg(
            positions.dtype in (torch.int32, torch.int64), OP, "positions", "dtype", "torch.int32 or torch.int64",
            positions.dtype,
        )  # fmt: skip
        ck.check_arg(
            positions.device == x.device,
            OP,
            "positions",
            "device",
            lambda: f"{x.device} (same as 'x')",
            positions.device,
        )
        same = positions.dim() == len(rows) and all(a == b for a, b in zip(positions.shape, rows))
        ck.check_arg(
            same,
            OP,
            "positions",
            "shape",
            lambda: f"{ck.shape_str(rows)} (x's tokens)",
            lambda: ck.shape_str(positions.shape),
        )


def check_rows(args) -> None:
    """The cache rows a call reads exist (a kernel's check of values; after ``rope_signature``)."""
    x, positions, offset = args.x, args.positions, args.seqlen_offset
    limit = args.cos_sin_cache.shape[0]
    if positions is None:
        need = offset + x.shape[-3]
        ck.check_arg(need <= limit, OP, "cos_sin_cache", "size(0)", f"at least seqlen_offset + tokens = {need}", limit)
        return
    if positions.numel():
        lo, hi = int(positions.min()) + offset, int(positions.max()) + offset
        ck.check_arg(
            0 <= lo and hi < limit, OP, "positions", "values", f"positions + seqlen_offset in [0, {limit})",
            f"[{lo}, {hi}]",
        )  # fmt: skip
