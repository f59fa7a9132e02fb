"""``rms_norm`` / ``rms_norm_quant`` on the later releases' RMSNorm kernels (``quant/norm_forward_kernel.py`` and
``norm_forward_cuda.py`` @ cd8f86c; absent from the first release 36d9e45: refused there with that reason).

``norm_forward(x, weight, eps, residual, out_scale, out, residual_out)`` computes our op's formula: ``s = x +
residual`` rounded to x's dtype, ``rstd = rsqrt(Σs²/H + eps)`` in FP32, ``s · rstd · (weight · out_scale)`` rounded to
x's dtype. Its row sums add in the kernel's order (per-thread accumulators, then a tree; upstream's own reference
notes PyTorch does not reproduce it bitwise), so ``rstd`` and the output are within the op's tolerance of ours, not
bitwise. ``norm_forward_and_per_token_cast`` adds the per-token E4M3 cast of the rounded output ("equals
``per_token_cast`` of ``norm_forward``", its docstring): the codes and scales are our cast of the kernel's own output,
bitwise (the tests check that), the output itself within tolerance.

Taken: BF16/FP32 x (``rms_norm_quant``: BF16 only, the fused kernel returns its normalized output as BF16; and
``round_sf`` only: without it the kernel multiplies by an inverse in ``get_sf_inv_dtype(x's dtype)``, whose source is
not readable), H a multiple of 16 up to 8192 (the CUDA kernel's limits; blocks of 32 or 128 dividing H for the cast),
rows 16-element strided and 16-byte aligned (its vector loads; x of any rank is handed over as its ``[rows, H]``
view), at least one row. ``rms_norm_quant`` also needs the values it casts finite (see the package docstring), which
``takes`` bounds from the inputs' largest magnitudes (a host read): ``eps > 0``, ``max|x| + max|residual| <= 3e38``
(a finite BF16 sum), ``sqrt(H) · max|weight · out_scale| <= 1e38`` (``|s_i| · rstd <= sqrt(H)``); no call while a
device graph is captured. ``rms_norm_backward`` is not mapped (``norm_backward``'s official source is not
readable).
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.upstream.tile_kernels import (
    FIRST_RELEASE,
    TILE_KERNELS,
    capture_refusal,
    finite_refusal,
    function,
    magnitude,
    missing,
    real_refusal,
)
from torch_ascend_moe.checks import norm as checks

MAX_HIDDEN = 8192
BF16_SUM_LIMIT = 3e38  # |x| + |residual| below BF16's largest finite value: the sum rounds to a finite one
LIMIT = 1e38


def _rows_refusal(name: str, t: torch.Tensor | None, h: int) -> str | None:
    if t is None:
        return None
    rows = t.reshape(-1, h) if t.dim() != 2 else t
    if t.data_ptr() % 16 or (rows.shape[0] > 1 and rows.stride(0) % 16) or rows.stride(1) != 1:
        return f"{name}'s rows are not 16-element strided and 16-byte aligned (the kernel's vector loads)"
    return None


def _refusal(args, path: str) -> str | None:
    x, h = args.x, args.x.shape[-1]
    why = real_refusal(x, args.weight, args.residual) or missing(path, FIRST_RELEASE)
    if why:
        return why
    if x.dtype not in (torch.bfloat16, torch.float32):
        return f"{x.dtype} x (the kernel normalizes BF16 or FP32)"
    if h % 16 or h > MAX_HIDDEN:
        return f"H = {h}: the CUDA kernel takes a multiple of 16 up to {MAX_HIDDEN}"
    if x.numel() == 0:
        return "no rows: nothing to hand the library"
    return _rows_refusal("x", x, h) or _rows_refusal("residual", args.residual, h)


def _takes_forward(args):
    checks.forward_signature(args)
    return first_refusal(_refusal(args, "quant.norm_forward"))


def _operands(args):
    x, h = args.x, args.x.shape[-1]
    weight = None if args.weight is None else args.weight.contiguous()
    residual = None if args.residual is None else args.residual.reshape(-1, h)
    residual_out = None if residual is None else torch.empty(residual.shape, dtype=x.dtype, device=x.device)
    return x.reshape(-1, h), weight, residual, residual_out


def _residual_out(args, residual_out):
    x = args.x
    return x.new_empty([0]) if residual_out is None else residual_out.view(x.shape)


@kernel(
    device="cuda",
    library="tile_kernels",
    calls="tile_kernels.quant.norm_forward",
    takes=_takes_forward,
    available=TILE_KERNELS.available,
)
def rms_norm(args):
    x = args.x
    x2, weight, residual, residual_out = _operands(args)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    _, rstd, _ = function("quant.norm_forward")(
        x2, weight, args.eps, residual=residual, out_scale=args.out_scale, out=out, residual_out=residual_out
    )
    return out.view(x.shape), rstd.view(x.shape[:-1]), _residual_out(args, residual_out)


def _takes_quant(args):
    checks.quant_signature(args)
    x, h, npc = args.x, args.x.shape[-1], args.num_per_channels
    why = _refusal(args, "quant.norm_forward_and_per_token_cast")
    if why is None and x.dtype != torch.bfloat16:
        why = f"{x.dtype} x (the fused kernel returns its normalized output as BF16 only)"
    if why is None and not args.round_sf:
        why = "no round_sf (the kernel's multiplier dtype for other scales, get_sf_inv_dtype, is not readable)"
    if why is None and (npc not in (32, 128) or h % npc):
        why = f"blocks of {npc}: the CUDA kernel casts in blocks of 32 or 128 dividing H"
    if why is None and args.eps <= 0:
        why = "eps 0: a zero row would normalize to NaN (0 · inf), which the kernel's cast ranks differently"
    why = why or capture_refusal(x)
    if why is None:  # |s_i| · rstd <= sqrt(H), so |y| <= sqrt(H) · max|weight · out_scale|
        sum_bound = magnitude(x) + magnitude(args.residual)
        why = finite_refusal(sum_bound, BF16_SUM_LIMIT, "x + residual")
        out_bound = math.sqrt(h) * (1.0 if args.weight is None else magnitude(args.weight)) * abs(args.out_scale)
        why = why or finite_refusal(out_bound, LIMIT, "the normalized output")
    return first_refusal(why)


@kernel(
    device="cuda",
    library="tile_kernels",
    calls="tile_kernels.quant.norm_forward_and_per_token_cast",
    takes=_takes_quant,
    available=TILE_KERNELS.available,
)
def rms_norm_quant(args):
    x, h = args.x, args.x.shape[-1]
    x2, weight, residual, residual_out = _operands(args)
    (q, sf), out, rstd, _ = function("quant.norm_forward_and_per_token_cast")(
        x2, weight, args.eps, "e4m3", args.num_per_channels, residual=residual, out_scale=args.out_scale,
        round_sf=True, with_out_bf16=True, residual_out=residual_out,
    )  # fmt: skip
    lead = x.shape[:-1]
    sf = sf.view(*lead, h // args.num_per_channels)
    return q.view(x.shape), sf, out.view(x.shape), rstd.view(lead), _residual_out(args, residual_out)
