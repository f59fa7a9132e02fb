"""``swiglu_forward`` / ``swiglu_backward`` on the first release's fused kernels (36d9e45:
``quant/swiglu_forward_and_per_token_cast_kernel.py``, ``quant/swiglu_backward_and_per_token_cast_kernel.py``).

Both kernels compute upstream's references ``tile_kernels.torch.swiglu_forward`` / ``swiglu_backward`` (bitwise, by
upstream's tests; the backward's weight gradient within 1e-4), which are our op's operations in their order:
``a / (1 + exp(-a)) * b``, times the row's weight; the backward's ``g · w · σ``, ``b · fma(a, 1 - σ, 1)``, clamped
elements' gradients 0, ``Σ g · act`` per row. Our arguments as theirs:

* one weight per row ``topk_weights [N]`` (times ``routed_scaling_factor``, in FP32, as our op) is a ``[N, 1]``
  weight table read through ``pos_to_token_topk = arange(N)`` (int32);
* the psum layout: its rows as ``pos_to_expert`` (-1 outside; the forward skips those rows and counts no clamp there)
  or, in the backward, as ``pos_to_token_topk = -1`` (weight 0); the rows outside are then written as our op defines
  them (zeros, the zero row's scale) on the device;
* ``clamp_value`` as ``swiglu_clamp_value``, always with ``clamped_count`` in the forward (its counting path keeps a
  NaN a NaN; the other one clamps it with ``fminf``), the fourth count (valid elements) ours.

Forward taken: an E4M3 output (the kernel always casts), BF16/FP32 contiguous x, H a multiple of 128, blocks of 128 or
H (clamp counts with 128-wide blocks only: upstream's tests count no other). Backward taken: an E4M3 x whose scales
cover 32 or 128 columns, the x_grad cast in the same blocks (or none: the kernel's cast is then dropped), a BF16
``grad_out`` (the kernel reads BF16 whatever it is given) and BF16 outputs. Both: at least one row, no fake tensors.
Non-finite values (see the package docstring): the values cast must stay finite, which ``takes`` bounds from the
inputs' largest magnitudes (a host read): ``|silu(a) · b · w| <= max|x|² · max|w|``, ``|x_grad| <= max|g| · max|w| ·
A · (1 + A)`` with ``A = max|x| · max|x_sf|``, below 1e38; with a cast, no call while a device graph is captured. The
later releases' psum-layout SwiGLU kernels (no ``pos_to_token_topk`` parameter) are refused: their official source
was not readable.
"""

from __future__ import annotations

import functools
import inspect

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.portable.quant import tile_cast
from torch_ascend_moe.backends.portable.swiglu import layout_rows
from torch_ascend_moe.backends.upstream.tile_kernels import (
    FIRST_RELEASE,
    TILE_KERNELS,
    capture_refusal,
    finite_refusal,
    function,
    magnitude,
    real_refusal,
)
from torch_ascend_moe.checks import swiglu as checks
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.quant.encodings import E4M3_AMAX_FLOOR

FORWARD = "quant.swiglu_forward_and_per_token_cast"
BACKWARD = "quant.swiglu_backward_and_per_token_cast"
ALIGN = 32  # bytes: the kernels' vector loads
LIMIT = 1e38  # what a bound on the values cast may reach: below FP32's (and BF16's) largest finite value


@functools.lru_cache(maxsize=8)
def _first_release_form(fn) -> bool:
    try:
        return "pos_to_token_topk" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def release_refusal(path: str) -> str | None:
    """Why the installed ``path`` is not the first release's kernel (its ``pos_to_token_topk`` signature), or None."""
    fn = function(path)
    if fn is None:
        return f"this tile_kernels has no {path}"
    if _first_release_form(fn):
        return None
    return f"this tile_kernels' {path} is not {FIRST_RELEASE}'s (pos_to_token_topk): its psum-layout form is not mapped"


def _common_refusal(args, x) -> str | None:
    why = real_refusal(args.x, args.topk_weights, args.psum_num_tokens_per_expert)
    if why:
        return why
    if x.shape[0] == 0:
        return "no rows: nothing to hand the library"
    if x.shape[0] >= 2**31:
        return "more rows than int32 positions index"
    if not x.is_contiguous() or x.data_ptr() % ALIGN:
        return f"x not contiguous and {ALIGN}-byte aligned (the kernel asserts a contiguous x; vector loads)"
    return None


def _takes_forward(args):
    checks.forward_signature(args)
    x, h, npc = args.x, args.x.shape[1] // 2, args.num_per_channels
    why = _common_refusal(args, x)
    if why is None and checks.forward_out_dtype(args) != checks.FP8:
        why = "an unquantized output (the first release's fused kernel always casts to E4M3)"
    if why is None and x.dtype not in (torch.bfloat16, torch.float32):
        why = f"{x.dtype} x (the kernel reads BF16 or FP32)"
    if why is None and h % 128:
        why = f"H = {h}: the kernel takes a multiple of 128"
    if why is None and npc not in (128, h):
        why = f"blocks of {npc}: the kernel casts in blocks of 128 or H"
    if why is None and args.clamp_value is not None and npc != 128:
        why = "clamp counts with one block per row: upstream's tests count clamps in 128-wide blocks only"
    why = why or release_refusal(FORWARD) or capture_refusal(x)
    if why is None:  # |silu(a) · b · w| <= max|x|^2 · max|w|
        a = magnitude(x)
        why = finite_refusal(a * a * _weight_bound(args), LIMIT, "the SwiGLU values")
    return first_refusal(why)


def _weight_bound(args) -> float:
    if args.topk_weights is None:
        return 1.0
    return magnitude(args.topk_weights) * abs(args.routed_scaling_factor or 1.0)


def _zero_row_scale(npc: int, round_sf: bool, floor: float, device) -> torch.Tensor:
    """Our op's scale of a zero row (rows outside the layout): the floored amax's, as the portable cast computes it."""
    return tile_cast(torch.zeros(1, npc, device=device), "e4m3", [1, npc], round_sf, None, floor)[1]


def _weights(args) -> torch.Tensor | None:
    """Our per-row weights as the kernel's weight table ``[N, 1]`` (FP32, times routed_scaling_factor as our op)."""
    w = args.topk_weights
    if w is None:
        return None
    w = w.float() if args.routed_scaling_factor is None else w.float() * args.routed_scaling_factor
    return w.reshape(-1, 1).contiguous()


def _rows(op: str, args, n: int, device):
    """The psum layout's rows (None: every row), its values checked first as our kernels check them."""
    psum = args.psum_num_tokens_per_expert
    if psum is not None and capture.host_readable(psum):
        checks.check_layout_values(op, psum, args.alignment, n)
    return layout_rows(psum, args.alignment, n, device)


@kernel(
    device="cuda",
    library="tile_kernels",
    calls="tile_kernels.quant.swiglu_forward_and_per_token_cast",
    takes=_takes_forward,
    available=TILE_KERNELS.available,
)
def swiglu_forward(args):
    x = args.x
    n, h, npc = x.shape[0], x.shape[1] // 2, args.num_per_channels
    rows = _rows(checks.FORWARD, args, n, x.device)
    positions = torch.arange(n, dtype=torch.int32, device=x.device)
    weights = _weights(args)
    count = None if args.clamp_value is None else torch.zeros(3, dtype=torch.int64, device=x.device)
    data, sf = function(FORWARD)(
        x, "e4m3", npc, pos_to_token_topk=None if weights is None else positions, topk_weights=weights,
        pos_to_expert=None if rows is None else torch.where(rows, 0, -1).to(torch.int32), round_sf=args.round_sf,
        swiglu_clamp_value=args.clamp_value, clamped_count=count, sf_clamp_min=args.sf_clamp_min,
    )  # fmt: skip
    if rows is not None:  # the rows the kernel skipped: our op's zero rows
        floor = E4M3_AMAX_FLOOR if args.sf_clamp_min is None else args.sf_clamp_min
        data = torch.where(rows[:, None], data.view(torch.uint8), 0).view(checks.FP8)
        sf = torch.where(rows[:, None], sf, _zero_row_scale(npc, args.round_sf, floor, x.device))
    valid = torch.full((1,), n * h, dtype=torch.int64, device=x.device) if rows is None else (rows.sum() * h)[None]
    counts = torch.zeros(4, dtype=torch.int64, device=x.device) if count is None else torch.cat([count, valid])
    return data, sf, counts


def _takes_backward(args):
    n, h, out_dtype, _ = checks.backward_signature(args)
    x, g, npc = args.x, args.grad_out, args.num_per_channels
    why = _common_refusal(args, x)
    if why is None and x.dtype != checks.FP8:
        why = f"a {x.dtype} x (the first release's backward takes an E4M3 x with its scales)"
    block = checks.x_scale_block(args) if why is None else 0
    if why is None and (block not in (32, 128) or h % block):
        why = f"x's scales cover {block} columns: the kernel takes blocks of 32 or 128 within each half"
    if why is None and npc not in (0, block):
        why = f"an x_grad cast in blocks of {npc} with x's scales in blocks of {block} (the kernel uses one size)"
    if why is None and (g.dtype != torch.bfloat16 or not g.is_contiguous()):
        why = f"a {g.dtype} or non-contiguous grad_out (the kernel reads a contiguous BF16 one)"
    if why is None and out_dtype != torch.bfloat16:
        why = f"{out_dtype} outputs (the kernel writes x_grad and out in BF16)"
    why = why or release_refusal(BACKWARD) or (capture_refusal(g) if npc else None)
    if why is None and npc:  # |x_grad| <= max|g| · max|w| · A · (1 + A), A = max|x| · max|x_sf|
        a = magnitude(x.float()) * magnitude(args.x_sf)
        why = finite_refusal(magnitude(g) * _weight_bound(args) * a * (1 + a), LIMIT, "the input gradient")
    return first_refusal(why)


@kernel(
    device="cuda",
    library="tile_kernels",
    calls="tile_kernels.quant.swiglu_backward_and_per_token_cast",
    takes=_takes_backward,
    available=TILE_KERNELS.available,
)
def swiglu_backward(args):
    n, h, out_dtype, _ = checks.backward_signature(args)
    x, g, npc = args.x, args.grad_out, args.num_per_channels
    block = checks.x_scale_block(args)
    rows = _rows(checks.BACKWARD, args, n, g.device)
    positions = torch.arange(n, dtype=torch.int32, device=g.device)
    if rows is not None:
        positions = torch.where(rows, positions, -1)
    weights = _weights(args)
    table = torch.ones(n, 1, dtype=torch.float32, device=g.device) if weights is None else weights
    out, (q, q_sf), x_grad, w_grad = function(BACKWARD)(
        (x, args.x_sf.contiguous()), g, table, positions, positions.view(n, 1), block, round_sf=args.round_sf,
        swiglu_clamp_value=args.clamp_value,
    )  # fmt: skip
    if rows is not None:  # rows outside the layout: our op's zeros (the kernel's are signed by grad_out)
        x_grad = torch.where(rows[:, None], x_grad, 0)
        out = torch.where(rows[:, None], out, 0)
        if npc:
            q = torch.where(rows[:, None], q.view(torch.uint8), 0).view(checks.FP8)
            q_sf = torch.where(rows[:, None], q_sf, _zero_row_scale(npc, args.round_sf, E4M3_AMAX_FLOOR, g.device))
    if not npc:
        q, q_sf = g.new_empty([0], dtype=checks.FP8), g.new_empty([0], dtype=torch.float32)
    if weights is None:
        w_grad = g.new_empty([0], dtype=torch.float32)
    else:
        w_grad = w_grad.view(n)
        if args.routed_scaling_factor is not None:
            w_grad = w_grad * args.routed_scaling_factor
    return x_grad, q, q_sf, w_grad, out
