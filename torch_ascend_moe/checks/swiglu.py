"""The swiglu family's argument checks (``swiglu_forward``, ``swiglu_backward``). Twin:
``csrc/ops/swiglu_checks.h`` (the same checks in the same order, the same words; tests/test_validation_twins.py
compares them)."""

from __future__ import annotations

import math

import torch

from torch_ascend_moe import checks as ck

FORWARD = "ascend_moe::swiglu_forward"
BACKWARD = "ascend_moe::swiglu_backward"
FLOAT_DTYPES = (torch.bfloat16, torch.float32, torch.float64)
FLOAT_DTYPES_TEXT = "torch.bfloat16, torch.float32 or torch.float64"
FP8 = torch.float8_e4m3fn
FORWARD_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float64, FP8)


def compute_dtype(*tensors) -> torch.dtype:
    """FP64 when any operand is FP64 (the gradcheck path), FP32 otherwise: TileKernels computes in FP32."""
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def check_same_device_as(op: str, arg: str, t, ref) -> None:
    ck.check_arg(t.device == ref.device, op, arg, "device", lambda: f"{ref.device} (same as 'x')", t.device)


def check_routing(op, args, x, rows) -> None:
    """topk_weights [N], the psum layout, alignment, routed_scaling_factor and clamp_value."""
    w = args.topk_weights
    if w is not None:
        ck.check_rank(op, "topk_weights", w, 1, "[N] (one weight per expanded row)")
        allowed = (torch.float32, torch.float64) if compute_dtype(x) == torch.float64 else (torch.float32,)
        ck.check_arg(
            w.dtype in allowed,
            op,
            "topk_weights",
            "dtype",
            "torch.float32 or torch.float64" if compute_dtype(x) == torch.float64 else "torch.float32",
            w.dtype,
        )
        check_same_device_as(op, "topk_weights", w, x)
        ck.check_dim_size(op, "topk_weights", w, 0, "N", rows, "x.size(0)")
    psum = args.psum_num_tokens_per_expert
    if psum is not None:
        ck.check_rank(op, "psum_num_tokens_per_expert", psum, 1, "[E] (cumulative expert ends)")
        ck.check_arg(psum.dtype == torch.int32, op, "psum_num_tokens_per_expert", "dtype", "torch.int32", psum.dtype)
        check_same_device_as(op, "psum_num_tokens_per_expert", psum, x)
    ck.check_int_arg(op, "alignment", args.alignment, 1)
    ck.check_arg(
        args.routed_scaling_factor is None or w is not None,
        op,
        "routed_scaling_factor",
        "presence",
        "None without 'topk_weights'",
        args.routed_scaling_factor,
    )
    c = args.clamp_value
    ck.check_arg(c is None or 0 < c < math.inf, op, "clamp_value", "value", "None or a positive finite float", c)


def check_x(op, x, quantized_ok: bool) -> tuple:
    ck.check_rank(op, "x", x, 2, "[N, 2H] (gate half, then up half)")
    allowed = FLOAT_DTYPES + ((FP8,) if quantized_ok else ())
    ck.check_arg(
        x.dtype in allowed,
        op,
        "x",
        "dtype",
        "torch.bfloat16, torch.float32, torch.float64 or torch.float8_e4m3fn" if quantized_ok else FLOAT_DTYPES_TEXT,
        x.dtype,
    )
    n, two_h = x.shape
    ck.check_arg(
        two_h % 2 == 0 and two_h > 0, op, "x", "size(1)", "an even number 2H > 0 ([a | b] halves)", lambda: two_h
    )
    return n, two_h // 2


def forward_out_dtype(args) -> torch.dtype:
    return compute_dtype(args.x) if args.out_dtype is None else args.out_dtype


def forward_signature(args) -> tuple[list, list]:
    """Checks a ``swiglu_forward`` call; returns (out shape, sf shape)."""
    x = args.x
    n, h = check_x(FORWARD, x, quantized_ok=False)
    check_routing(FORWARD, args, x, n)
    ck.check_arg(
        args.out_dtype is None or args.out_dtype in FORWARD_OUT_DTYPES,
        FORWARD,
        "out_dtype",
        "value",
        "None, torch.float32, torch.bfloat16, torch.float64 or torch.float8_e4m3fn (the per-token cast)",
        args.out_dtype,
    )
    ck.check_int_arg(FORWARD, "num_per_channels", args.num_per_channels, 1)
    floor = args.sf_clamp_min
    ck.check_arg(
        floor is None or 0 < floor < math.inf,
        FORWARD,
        "sf_clamp_min",
        "value",
        "None or a positive finite float",
        floor,
    )
    quantized = forward_out_dtype(args) == FP8
    return [n, h], ([n, -(-h // args.num_per_channels)] if quantized else [0])


def x_scale_block(args) -> int:
    """The columns each of x_sf's scales covers (``2H / x_sf.size(1)``); 0 for an unquantized x."""
    x, sf = args.x, args.x_sf
    if x.dtype != FP8:
        ck.check_arg(sf is None, BACKWARD, "x_sf", "presence", lambda: f"None for a {x.dtype} x", "a tensor")
        return 0
    ck.check_arg(sf is not None, BACKWARD, "x_sf", "presence", "given with an E4M3 x (its per-row block scales)", None)
    ck.check_rank(BACKWARD, "x_sf", sf, 2, "[N, 2H / block] (FP32 per-row block scales)")
    ck.check_arg(sf.dtype == torch.float32, BACKWARD, "x_sf", "dtype", "torch.float32", sf.dtype)
    check_same_device_as(BACKWARD, "x_sf", sf, x)
    ck.check_dim_size(BACKWARD, "x_sf", sf, 0, "N", x.shape[0], "x.size(0)")
    two_h, s = x.shape[1], sf.shape[1]
    ck.check_arg(
        s > 0 and two_h % s == 0,
        BACKWARD,
        "x_sf",
        "size(1)",
        lambda: f"a divisor of 2H={ck._text(two_h)} (equal blocks of x's columns)",
        lambda: s,
    )
    return two_h // s


def backward_signature(args) -> tuple:
    """Checks a ``swiglu_backward`` call; returns (N, H, x_grad/out dtype, sf columns or None)."""
    x, g = args.x, args.grad_out
    n, h = check_x(BACKWARD, x, quantized_ok=True)
    x_scale_block(args)
    ck.check_rank(BACKWARD, "grad_out", g, 2, "[N, H]")
    ck.check_arg(g.dtype in FLOAT_DTYPES, BACKWARD, "grad_out", "dtype", FLOAT_DTYPES_TEXT, g.dtype)
    check_same_device_as(BACKWARD, "grad_out", g, x)
    same = g.shape[0] == n and g.shape[1] == h
    ck.check_arg(same, BACKWARD, "grad_out", "shape", lambda: f"{ck.shape_str([n, h])} (x's rows, H)", g.shape)
    check_routing(BACKWARD, args, x if x.dtype != FP8 else g, n)
    out_dtype = g.dtype if args.out_dtype is None else args.out_dtype
    ck.check_arg(out_dtype in FLOAT_DTYPES, BACKWARD, "out_dtype", "value", f"None or {FLOAT_DTYPES_TEXT}", out_dtype)
    ck.check_int_arg(BACKWARD, "num_per_channels", args.num_per_channels, 0)
    npc = args.num_per_channels
    return n, h, out_dtype, (-(-2 * h // npc) if npc else None)


def check_layout_values(op: str, psum: torch.Tensor | None, alignment: int, rows: int) -> None:
    """The psum layout's values (a kernel's check; fakes cannot see values): nondecreasing, and every expert's rows
    ``[align(psum[e-1]), psum[e])`` inside x's rows (an empty expert may end anywhere up to its aligned start, as
    TileKernels' and DeepEP V2's layouts write them)."""
    if psum is None:
        return
    prev = 0
    for e, end in enumerate(psum.tolist()):
        start = -(-prev // alignment) * alignment
        ck.check_arg(
            end >= prev and (end <= rows or end <= start),
            op,
            "psum_num_tokens_per_expert",
            "values",
            f"nondecreasing cumulative expert ends, expert e's rows [align(psum[e-1], alignment={alignment}), "
            f"psum[e]) within x's {rows} rows",
            f"psum[{e}] = {end} (after {prev})",
        )
        prev = end
