"""What the later release (deepseek-ai/TileKernels @ cd8f86c: ``quant/norm_forward_kernel.py``,
``quant/norm_forward_cuda.py``) adds to ``tile_kernels.quant`` and ``config``, as the stand-in imitates it on CUDA.

``norm_forward`` / ``norm_forward_and_per_token_cast``: upstream's Python checks with their words (its ``assert``
conditions and messages), its allocations (``out`` like x, FP32 ``rstd`` ``x.shape[:-1]``, row-major FP32 scales,
3-D scales as ``[batch, T, H / npc]``, ``norm_input`` aliasing x without a residual) and the kernel's arithmetic: the
residual added in x's dtype, each thread's squares summed into two FP32 accumulators over its 16-byte vectors, the
threads' partials reduced as a tree, ``rstd = rsqrt(sum / hidden + eps)``, ``y = x · rstd · (weight · out_scale)``
rounded to x's dtype; the cast's amax taken on the FP32 values (NaN loses), rounded to x's dtype, and the rounded
output times the multiplier (FP32 here; upstream's ``get_sf_inv_dtype`` is not readable). Not modelled
(``NotImplementedError``): ``mega_moe_sf``, column-major or packed scales, external ``out_sf`` buffers.

The fused SwiGLU kernels of the later releases take the psum layout (the form Butterfingrz/TileKernels @ 66258df
shows); the stand-in has their signatures only (``NotImplementedError`` when called).
"""

from __future__ import annotations

import math

import torch

from tile_kernels import _ref
from tile_kernels._standin import Panic, check, record

NF = "tile_kernels/quant/norm_forward_kernel.py"


def is_ascend() -> bool:
    return False


_PDL = [False]


def set_pdl(enabled: bool) -> None:
    _PDL[0] = bool(enabled)


def get_pdl() -> bool:
    return _PDL[0]


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _row_sums(s: torch.Tensor, with_sf: bool, num_per_channels: int) -> torch.Tensor:
    """FP32 sums of squares of the rows of ``s [rows, hidden]`` in the CUDA kernel's order (norm_forward_cuda.py)."""
    rows, hidden = s.shape
    vec = math.gcd(16 // s.element_size(), hidden)
    num_vecs = hidden // vec
    group_lanes = num_per_channels // vec if with_sf else 1
    row_threads = min(128, max(group_lanes, min(8, _next_power_of_2(num_vecs)), _next_power_of_2(-(-hidden // 32))))
    per_thread = -(-num_vecs // row_threads)
    padded = torch.zeros(rows, per_thread * row_threads * vec, dtype=torch.float32)
    padded[:, :hidden] = s.float()
    # vector v = vi * row_threads + thread: [rows, per_thread, row_threads, vec]
    v = padded.view(rows, per_thread, row_threads, vec)
    acc = torch.zeros(rows, row_threads, 2, dtype=torch.float32)
    for vi in range(per_thread):
        for j in range(vec):
            acc[:, :, j % 2] += v[:, vi, :, j] * v[:, vi, :, j]
    partial = acc[:, :, 0] + acc[:, :, 1]
    warp = min(32, row_threads)
    lanes = partial.view(rows, row_threads // warp, warp)
    while lanes.shape[-1] > 1:  # butterfly within a warp, as lane 0 sees it
        half = lanes.shape[-1] // 2
        lanes = lanes[..., :half] + lanes[..., half:]
    total = lanes[..., 0, 0].clone()
    for w in range(1, lanes.shape[1]):
        total += lanes[:, w, 0]
    return total


def _impl(x, weight, eps, fmt, num_per_channels, residual, out_scale, col_major, round_sf, packed, with_out_bf16,
          out, out_sf, out_bf16, residual_out, mega_moe_sf, mega_moe_block_m):  # fmt: skip
    check(x.ndim in (2, 3) and x.dtype in (torch.bfloat16, torch.float32) and x.stride(-1) == 1, NF,
          "x.ndim in (2, 3) and x.dtype in (torch.bfloat16, torch.float32) and x.stride(-1) == 1")  # fmt: skip
    tokens, hidden = x.shape[-2:]
    batch = x.shape[0] if x.ndim == 3 else 1
    check(hidden > 0, NF, "hidden > 0")
    check(hidden % 16 == 0 and hidden <= 8192, NF, "hidden % 16 == 0 and hidden <= 8192")
    if weight is not None:
        check(weight.shape == (hidden,) and weight.dtype == x.dtype and weight.device == x.device
              and weight.is_contiguous(), NF, "weight.shape == (hidden,) and weight.dtype == x.dtype and "
              "weight.device == x.device and weight.is_contiguous()")  # fmt: skip
    check((fmt == "e4m3" and num_per_channels in (32, 128)) or (fmt, num_per_channels) in [("bf16", None),
          ("fp32", None)], NF, "(fmt == 'e4m3' and num_per_channels in valid_quant_groups) or (fmt, num_per_channels) "
          "in [('bf16', None), ('fp32', None)]")  # fmt: skip
    with_sf = fmt == "e4m3"
    out_dtype = {"e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16, "fp32": torch.float32}[fmt]
    check(with_sf or out_dtype == x.dtype, NF, "out_config.with_sf or out_config.torch_dtype == x.dtype, "
          "'the unquantized output must match the input dtype'")  # fmt: skip
    check(not with_sf or hidden % num_per_channels == 0, NF, "not out_config.with_sf or hidden % num_per_channels == 0")
    check(not with_out_bf16 or with_sf, NF, "not with_out_bf16 or out_config.with_sf, 'the extra output is only "
          "needed with casting'")  # fmt: skip
    check((mega_moe_sf is None) == (mega_moe_block_m == 0), NF, "(mega_moe_sf is None) == (mega_moe_block_m == 0)")
    if mega_moe_sf is not None or out_sf is not None or col_major or packed:
        raise NotImplementedError("tile_kernels stand-in: mega_moe_sf, external or column-major scales not modelled")
    if out is None:
        out = torch.empty(x.shape, dtype=out_dtype, device=x.device)
    if with_out_bf16 and out_bf16 is None:
        out_bf16 = torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)
    if not with_out_bf16:
        check(out_bf16 is None, NF, "out_bf16 is None")
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x)
    for t in (residual, residual_out):
        if t is not None:
            check(t.shape == x.shape and t.dtype == x.dtype and t.device == x.device and t.stride(-1) == 1, NF,
                  "tensor.shape == x.shape and tensor.dtype == x.dtype and tensor.device == x.device and "
                  "tensor.stride(-1) == 1")  # fmt: skip
    check(out.shape == x.shape and out.dtype == out_dtype and out.device == x.device and out.stride(-1) == 1, NF,
          "out.shape == x.shape and out.dtype == out_config.torch_dtype and out.device == x.device and "
          "out.stride(-1) == 1")  # fmt: skip
    rstd = torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)
    sf = None
    if with_sf:
        sf = torch.empty(batch * tokens, hidden // num_per_channels, dtype=torch.float32, device=x.device)
    if batch * tokens > 0:
        for t in (x, out, out_bf16, residual, residual_out):
            if t is not None:
                check(all(st % 16 == 0 for st in t.stride()[:-1]), NF,
                      "all(stride % 16 == 0 for stride in tensor.stride()[:-1])")  # fmt: skip
        if x.data_ptr() % 16:
            raise Panic("x: 16-byte vector loads from a misaligned address (the kernel traps)")
        x2 = x.reshape(-1, hidden)
        s = x2 if residual is None else (x2 + residual.reshape(-1, hidden)).to(x.dtype)
        if residual is not None:
            residual_out.copy_(s.view(x.shape))
        total = _row_sums(s, with_sf, num_per_channels or 1)
        r = (total / hidden + eps).rsqrt()
        rstd.copy_(r.view(x.shape[:-1]))
        sfp = s.float()
        scale = out_scale if weight is None else weight.float() * out_scale
        y32 = sfp * r[:, None] * scale
        y = y32.to(x.dtype)
        if with_sf:
            groups = hidden // num_per_channels
            amax = _ref.kernel_amax(y32.view(-1, groups, num_per_channels), dims=(2,)).to(x.dtype).float()
            scale_f, inv = _ref.kernel_sf_and_inv(amax, "e4m3", round_sf)
            q = (y.float().view(-1, groups, num_per_channels) * inv[:, :, None]).view(-1, hidden)
            out.copy_(_ref.encode(q, "e4m3").view(x.shape))
            sf.copy_(scale_f)
            if with_out_bf16:
                out_bf16.copy_(y.view(x.shape))
        else:
            out.copy_(y.view(x.shape))
    norm_input = x if residual is None else residual_out
    if with_sf:
        if x.ndim == 3:
            sf = sf.view(batch, tokens, -1)
        return (out, sf), out_bf16, rstd, norm_input
    return out, None, rstd, norm_input


def norm_forward_and_per_token_cast(x, weight, eps: float, fmt: str, num_per_channels: int, residual=None,
                                    out_scale: float = 1.0, use_tma_aligned_col_major_sf: bool = False,
                                    round_sf: bool = False, use_packed_ue8m0: bool = False,
                                    with_out_bf16: bool = False, out=None, out_bf16=None, residual_out=None,
                                    mega_moe_sf=None, mega_moe_block_m: int = 0):  # fmt: skip
    record("norm_forward_and_per_token_cast", x=x, weight=weight, eps=eps, fmt=fmt, num_per_channels=num_per_channels,
           residual=residual, out_scale=out_scale, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
           round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0, with_out_bf16=with_out_bf16, out=out,
           out_bf16=out_bf16, residual_out=residual_out, mega_moe_sf=mega_moe_sf)  # fmt: skip
    out_data, out_sf = (None, None) if out is None else out
    return _impl(x, weight, eps, fmt, num_per_channels, residual, out_scale, use_tma_aligned_col_major_sf, round_sf,
                 use_packed_ue8m0, with_out_bf16, out_data, out_sf, out_bf16, residual_out, mega_moe_sf,
                 mega_moe_block_m)  # fmt: skip


def norm_forward(x, weight, eps: float, residual=None, out_scale: float = 1.0, out=None, residual_out=None):
    record("norm_forward", x=x, weight=weight, eps=eps, residual=residual, out_scale=out_scale, out=out,
           residual_out=residual_out)  # fmt: skip
    check(x.dtype in (torch.bfloat16, torch.float32), NF, "x.dtype in (torch.bfloat16, torch.float32)")
    fmt = "bf16" if x.dtype == torch.bfloat16 else "fp32"
    result, _, rstd, norm_input = _impl(x, weight, eps, fmt, None, residual, out_scale, False, False, False, False,
                                        out, None, None, residual_out, None, 0)  # fmt: skip
    return result, rstd, norm_input


def swiglu_forward_and_per_token_cast(x, fmt, num_per_channels, psum_num_tokens_per_expert=None, topk_weights=None,
                                      routed_scaling_factor=None, use_tma_aligned_col_major_sf=False, round_sf=False,
                                      use_packed_ue8m0=False, clamp_value=None, clamped_count=None):  # fmt: skip
    record("swiglu_forward_and_per_token_cast (psum)")
    raise NotImplementedError("tile_kernels stand-in: the psum-layout SwiGLU kernels are not modelled")


def swiglu_backward_and_per_token_cast(x, grad_out, fmt, num_per_channels, psum_num_tokens_per_expert=None,
                                       topk_weights=None, routed_scaling_factor=None,
                                       use_tma_aligned_col_major_sf=False, round_sf=False,
                                       use_packed_ue8m0=False, clamp_value=None, do_recompute=False):  # fmt: skip
    record("swiglu_backward_and_per_token_cast (psum)")
    raise NotImplementedError("tile_kernels stand-in: the psum-layout SwiGLU kernels are not modelled")
