"""``tile_kernels.quant`` of the stand-in: the casts and the fused SwiGLU kernels of 36d9e45 (signatures, asserts,
allocations and scale layouts from ``quant/*_kernel.py`` and ``quant/common.py``; math in ``_ref``). On the later
release (cd8f86c) ``norm_forward(_and_per_token_cast)`` join (``_later``), ``per_token_cast`` asserts the later form
(``num_per_channels in (16, 32, 64, 128) and hidden % 64 == 0``, no E5M6: Butterfingrz/TileKernels @ 828cc15, the only
later ``per_token_cast_kernel.py`` readable) and the fused SwiGLU kernels take the psum layout.

Not modelled (``NotImplementedError``): QuantTensor inputs, E5M6, ``per_block_cast_lossless``, ``cast_back``,
``per_channel_cast_fused``'s gather, ``swiglu_forward_and_per_channel_cast_and_transpose``.
"""

from __future__ import annotations

import torch

from tile_kernels import _ref
from tile_kernels._fma import fma
from tile_kernels._standin import Panic, aligned_loads, check, later, record

PT = "tile_kernels/quant/per_token_cast_kernel.py"
PB = "tile_kernels/quant/per_block_cast_kernel.py"
PC = "tile_kernels/quant/per_channel_cast_kernel.py"
CM = "tile_kernels/quant/common.py"
SF = "tile_kernels/quant/swiglu_forward_and_per_token_cast_kernel.py"
SB = "tile_kernels/quant/swiglu_backward_and_per_token_cast_kernel.py"


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def sf_layout(sf: torch.Tensor, col_major: bool, packed: bool) -> torch.Tensor:
    """A row-major FP32 ``[rows, cols]`` scale tensor in upstream's output layout (``alloc_scaling_factors`` then
    ``cast_epilogue``): as is; column-major with the row count padded to 4 in the allocation; or the exponent bytes
    packed four per int32 along the columns, column-major, rows padded to 4 (bytes past the last column 0 here:
    unspecified upstream)."""
    if not col_major and not packed:
        return sf
    rows, cols = sf.shape
    if packed:
        codes = (sf.view(torch.int32) >> 23).to(torch.uint8)
        storage = torch.zeros(_align(cols, 4) // 4, _align(rows, 4) * 4, dtype=torch.uint8, device=sf.device)
        # store_sf: tensor[k // 4, m * 4 + k % 4]
        view = storage[:, : rows * 4].view(-1, rows, 4)
        for k in range(cols):
            view[k // 4, :, k % 4] = codes[:, k]
        return storage.view(torch.int32)[:, :rows].T if rows else storage.view(torch.int32)[:, :0].T
    storage = torch.empty(cols, _align(rows, 4), dtype=torch.float32, device=sf.device)
    storage[:, :rows] = sf.T
    return storage[:, :rows].T


def _plain_input(x, x_block_size) -> torch.Tensor:
    if isinstance(x, tuple):
        raise NotImplementedError("tile_kernels stand-in: QuantTensor inputs are not modelled")
    check(x_block_size is None, f"{CM}:85", "sf_block is None")
    check(x.dtype in (torch.bfloat16, torch.float32), f"{CM}:87", "x.dtype in (torch.bfloat16, torch.float32)")
    return x


def _per_token(name, x, fmt, num_per_channels, x_block_size, col_major, round_sf, packed, sf_only=False, sf=None):
    record(name, x=x, fmt=fmt, num_per_channels=num_per_channels, x_block_size=x_block_size,
           use_tma_aligned_col_major_sf=col_major, round_sf=round_sf, use_packed_ue8m0=packed, sf=sf)  # fmt: skip
    if later():
        check(fmt in ("e4m3", "e2m1"), PT, "fmt in ('e4m3', 'e2m1')")
    else:
        check(fmt in ("e5m6", "e4m3", "e2m1"), f"{PT}:170", "fmt in ('e5m6', 'e4m3', 'e2m1')")
        if fmt == "e5m6":
            raise NotImplementedError("tile_kernels stand-in: E5M6 casts are not modelled")
    x = _plain_input(x, x_block_size)
    tokens, hidden = x.shape
    if later():
        check(num_per_channels in (16, 32, 64, 128) and hidden % 64 == 0, PT,
              "num_per_channels in (16, 32, 64, 128) and hidden % 64 == 0")  # fmt: skip
        check(sf is None or (not col_major and not packed), PT, "sf is None or (not use_tma_aligned_col_major_sf and "
              "not use_packed_ue8m0), 'Cast-only mode only supports row-major, non-packed SF'")  # fmt: skip
    else:
        check(num_per_channels in (16, 32, 64, 128) or (num_per_channels == hidden and hidden % 64 == 0), f"{PT}:182",
              "num_per_channels in (16, 32, 64, 128) or (num_per_channels == hidden and hidden % 64 == 0)")  # fmt: skip
        if hidden == num_per_channels:
            check(sf is None and not sf_only, f"{PT}:33", "not in_config.with_sf and not cast_only and not sf_only")
    if x.stride(1) != 1 and tokens:
        raise Panic("x's columns are not contiguous: the kernel reads rows (token_stride, 1) and gets garbage")
    aligned_loads("x", x)
    if sf is not None:
        shape = (tokens, -(-hidden // num_per_channels))
        if tuple(sf.shape) != shape or sf.dtype != torch.float32 or (tokens and sf.stride(1) != 1):
            raise Panic(f"a precomputed sf {tuple(sf.shape)} {sf.dtype} read as row-major FP32 {shape}: garbage")
        return _ref.kernel_cast(x.float(), fmt, (1, num_per_channels), round_sf, sf=sf)
    data, scale = _ref.kernel_cast(x.float(), fmt, (1, num_per_channels), round_sf)
    scale = sf_layout(scale, col_major, packed)
    return scale if sf_only else (data, scale)


def per_token_cast(x, fmt: str, num_per_channels: int, x_block_size=None, use_tma_aligned_col_major_sf: bool = False,
                   round_sf: bool = False, use_packed_ue8m0: bool = False):  # fmt: skip
    return _per_token("per_token_cast", x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf,
                      round_sf, use_packed_ue8m0)  # fmt: skip


def per_token_cast_with_sf_only(x, fmt: str, num_per_channels: int, x_block_size=None,
                                use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                use_packed_ue8m0: bool = False):  # fmt: skip
    return _per_token("per_token_cast_with_sf_only", x, fmt, num_per_channels, x_block_size,
                      use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, sf_only=True)  # fmt: skip


def per_token_cast_with_precomputed_sf(x, fmt: str, num_per_channels: int, sf: torch.Tensor, x_block_size=None,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False):  # fmt: skip
    return _per_token("per_token_cast_with_precomputed_sf", x, fmt, num_per_channels, x_block_size,
                      use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0, sf=sf)  # fmt: skip


def _per_block(name, x, fmt, block_size, col_major, round_sf, packed, sf_only=False, sf=None):
    record(name, x=x, fmt=fmt, block_size=block_size, use_tma_aligned_col_major_sf=col_major, round_sf=round_sf,
           use_packed_ue8m0=packed, sf=sf)  # fmt: skip
    check(x.is_contiguous() and x.dim() == 2, f"{PB}:159", "x.is_contiguous() and x.dim() == 2")
    tokens, hidden = x.shape
    check(hidden % 64 == 0, f"{PB}:162", "hidden % 64 == 0")
    if sf is not None:
        check(not sf_only and not col_major and not packed, f"{PB}:164",
              "not sf_only and not use_tma_aligned_col_major_sf and not use_packed_ue8m0")  # fmt: skip
    x = _plain_input(x, None)
    check(fmt in ("e5m6", "e4m3", "e2m1"), f"{CM}:99", "fmt in ('e5m6', 'e4m3', 'e2m1')")
    if fmt == "e5m6":
        raise NotImplementedError("tile_kernels stand-in: E5M6 casts are not modelled")
    block = tuple(block_size)
    check(block[0] in (32, 128) and block[1] in (32, 128), f"{PB}:30",
          "num_per_tokens in (32, 128) and num_per_channels in (32, 128)")  # fmt: skip
    vectorize = (32 if later_arch() else 16) // x.element_size()
    block_k = max(block[1], 8192 // block[0])
    check(block[0] % (256 * vectorize // block_k) == 0, f"{PB}:38",
          "num_per_tokens % num_repeat_rows == 0, 'scaling factor block size too small to be multiple of the row "
          "repeat pattern'")  # fmt: skip
    aligned_loads("x", x)
    if sf is not None:
        shape = (-(-tokens // block[0]), -(-hidden // block[1]))
        if tuple(sf.shape) != shape or sf.dtype != torch.float32 or (tokens and sf.stride(1) != 1):
            raise Panic(f"a precomputed sf {tuple(sf.shape)} {sf.dtype} read as row-major FP32 {shape}: garbage")
        return _ref.kernel_cast(x.float(), fmt, block, round_sf, sf=sf)
    data, scale = _ref.kernel_cast(x.float(), fmt, block, round_sf)
    scale = sf_layout(scale, col_major, packed)
    return scale if sf_only else (data, scale)


def later_arch() -> bool:
    from tile_kernels._standin import STATE

    return STATE["arch"] >= 10


def per_block_cast(x, fmt: str, block_size, use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                   use_packed_ue8m0: bool = False):  # fmt: skip
    return _per_block("per_block_cast", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def per_block_cast_with_sf_only(x, fmt: str, block_size, use_tma_aligned_col_major_sf: bool = False,
                                round_sf: bool = False, use_packed_ue8m0: bool = False):  # fmt: skip
    return _per_block("per_block_cast_with_sf_only", x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf,
                      use_packed_ue8m0, sf_only=True)  # fmt: skip


def per_block_cast_with_precomputed_sf(x, fmt: str, block_size, sf: torch.Tensor,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False):  # fmt: skip
    return _per_block("per_block_cast_with_precomputed_sf", x, fmt, block_size, use_tma_aligned_col_major_sf,
                      round_sf, use_packed_ue8m0, sf=sf)  # fmt: skip


def per_channel_cast(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False):
    record("per_channel_cast", x=x, fmt=fmt, num_per_tokens=num_per_tokens, round_sf=round_sf)
    check(x.is_contiguous() and x.dim() == 2, f"{PC}:20", "x.is_contiguous() and x.dim() == 2")
    check(fmt == "e4m3", f"{PC}:21", "fmt == 'e4m3'")
    tokens, hidden = x.shape
    check(tokens % 128 == 0 and hidden % 64 == 0, f"{PC}:25", "num_tokens % 128 == 0 and hidden % 64 == 0")
    check(num_per_tokens == 128, f"{PC}:26", "num_per_tokens == 128")
    x = _plain_input(x, None)
    aligned_loads("x", x)
    # per_channel_cast_fused: FP32 [ceil(T / 128), H] scales, allocated (on 'cuda' upstream) row-major
    return _ref.kernel_cast(x.float(), fmt, (num_per_tokens, 1), round_sf)


def v1_swiglu_forward_and_per_token_cast(x: torch.Tensor, fmt: str, num_per_channels: int, pos_to_token_topk=None,
                                         topk_weights=None, pos_to_expert=None,
                                         use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                         use_packed_ue8m0: bool = False, swiglu_clamp_value=None, clamped_count=None,
                                         sf_clamp_min=None):  # fmt: skip
    """36d9e45's fused SwiGLU forward and per-token E4M3 cast (see the module docstring of ``_ref`` for the amax)."""
    record("swiglu_forward_and_per_token_cast", x=x, fmt=fmt, num_per_channels=num_per_channels,
           pos_to_token_topk=pos_to_token_topk, topk_weights=topk_weights, pos_to_expert=pos_to_expert,
           use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, round_sf=round_sf,
           use_packed_ue8m0=use_packed_ue8m0, swiglu_clamp_value=swiglu_clamp_value, clamped_count=clamped_count,
           sf_clamp_min=sf_clamp_min)  # fmt: skip
    check(x.dim() == 2 and x.is_contiguous(), f"{SF}:208", "x.dim() == 2 and x.is_contiguous()")
    rows, hidden = x.shape[0], x.shape[1] // 2
    if pos_to_token_topk is not None:
        check(pos_to_token_topk.dim() == 1, f"{SF}:213", "pos_to_token_topk.dim() == 1")
        check(topk_weights is not None, f"{SF}:215", "topk_weights is not None")
        check(topk_weights.dim() == 2, f"{SF}:216", "topk_weights.dim() == 2")
    if pos_to_expert is not None:
        check(pos_to_expert.dim() == 1, f"{SF}:219", "pos_to_expert.dim() == 1")
        check(pos_to_expert.shape[0] == rows, f"{SF}:220", "pos_to_expert.shape[0] == num_expanded_tokens")
    if clamped_count is not None:
        check(swiglu_clamp_value is not None, f"{SF}:223", "swiglu_clamp_value is not None")
        check(clamped_count.dim() == 1, f"{SF}:224", "clamped_count.dim() == 1")
        check(clamped_count.shape[0] == 3, f"{SF}:225", "clamped_count.shape[0] == 3")
    check(hidden % 128 == 0, f"{SF}:228", "hidden % 128 == 0")
    check(num_per_channels == 128 or num_per_channels == hidden, f"{SF}:229",
          "num_per_channels == 128 or num_per_channels == hidden")  # fmt: skip
    check(num_per_channels == 128 or not use_tma_aligned_col_major_sf, f"{SF}:230",
          "num_per_channels == 128 or (not use_tma_aligned_col_major_sf)")  # fmt: skip
    check(fmt == "e4m3", f"{SF}:231", "fmt == 'e4m3'")
    # T.Tensor argument types of the kernel
    for name, t, dtype in (("pos_to_token_topk", pos_to_token_topk, torch.int32), ("topk_weights", topk_weights,
                           torch.float32), ("pos_to_expert", pos_to_expert, torch.int32),
                           ("clamped_count", clamped_count, torch.int64)):  # fmt: skip
        if t is not None and (t.dtype != dtype or not t.is_contiguous()):
            raise Panic(f"{name}: a {t.dtype} tensor passed as the kernel's contiguous {dtype}")
    if pos_to_token_topk is not None and pos_to_token_topk.shape[0] < rows:
        raise Panic("pos_to_token_topk shorter than x: the kernel reads past it")
    active = torch.ones(rows, dtype=torch.bool) if pos_to_expert is None else pos_to_expert >= 0
    xf = x.float()
    a, b = xf[:, :hidden], xf[:, hidden:]
    if swiglu_clamp_value is not None:
        c = torch.tensor(swiglu_clamp_value, dtype=torch.float32)
        if clamped_count is not None:  # T.Select: a NaN stays NaN
            for i, flags in enumerate((a > c, b > c, b < -c)):
                clamped_count[i] += int((flags & active[:, None]).sum())
            a = torch.where(a > c, c, a)
            b = torch.where(b > c, c, torch.where(b < -c, -c, b))
        else:  # T.min / T.max: fminf, fmaxf (a NaN becomes the bound)
            a = torch.fmin(a, c)
            b = torch.fmax(torch.fmin(b, c), -c)
    y = a / (1 + torch.exp(-a)) * b
    if pos_to_token_topk is not None:
        p = pos_to_token_topk.long()
        if bool(((p < 0) & active).any()):
            raise Panic("a row with pos_to_token_topk < 0: the kernel multiplies by a weight it never loaded")
        if bool(((p >= topk_weights.numel()) & active).any()):
            raise Panic("pos_to_token_topk past topk_weights: the kernel reads out of bounds")
        y = y * topk_weights.reshape(-1)[p.clamp(0, max(topk_weights.numel() - 1, 0))][:, None]
    data, scale = _ref.kernel_cast(y, "e4m3", (1, num_per_channels), round_sf, clamp_min=sf_clamp_min)
    # Rows with pos_to_expert == -1 are skipped: their codes and scales are whatever the buffers held.
    data = torch.where(active[:, None], data.view(torch.uint8), 0x7E).view(torch.float8_e4m3fn)
    scale = torch.where(active[:, None], scale, -12345.0)
    return data, sf_layout(scale, use_tma_aligned_col_major_sf, use_packed_ue8m0)


def v1_swiglu_backward_and_per_token_cast(x, grad_out: torch.Tensor, weight: torch.Tensor,
                                          pos_to_token_topk: torch.Tensor, token_topk_to_pos: torch.Tensor,
                                          num_per_channels: int, round_sf: bool = False,
                                          swiglu_clamp_value=None):  # fmt: skip
    """36d9e45's fused SwiGLU backward and per-token E4M3 cast of the FP32 input gradient:
    ``(out, (x_grad_fp8, x_grad_sf), x_grad, weight_grad)``, ``out`` and ``x_grad`` BF16 (the kernel stores BF16)."""
    record("swiglu_backward_and_per_token_cast", x=x, grad_out=grad_out, weight=weight,
           pos_to_token_topk=pos_to_token_topk, token_topk_to_pos=token_topk_to_pos,
           num_per_channels=num_per_channels, round_sf=round_sf, swiglu_clamp_value=swiglu_clamp_value)  # fmt: skip
    check(num_per_channels in (32, 128), f"{SB}:188", "num_per_channels in (32, 128)")
    data, x_sf = x
    check(data.dtype == torch.float8_e4m3fn, f"{SB}:191", "x.dtype == torch.float8_e4m3fn")
    check(data.dim() in (2, 3) and data.is_contiguous(), f"{SB}:192", "(x.dim() == 2 or x.dim() == 3) and "
          "x.is_contiguous()")  # fmt: skip
    check(x_sf.dim() == 2 and x_sf.is_contiguous(), f"{SB}:193", "x_sf.dim() == 2 and x_sf.is_contiguous()")
    check(weight.dim() == 2 and weight.is_contiguous(), f"{SB}:194", "weight.dim() == 2 and weight.is_contiguous()")
    check(pos_to_token_topk.dim() == 1, f"{SB}:195", "pos_to_token_topk.dim() == 1")
    check(token_topk_to_pos.dim() == 2 and token_topk_to_pos.is_contiguous(), f"{SB}:196",
          "token_topk_to_pos.dim() == 2 and token_topk_to_pos.is_contiguous()")  # fmt: skip
    check(data.size(-1) % (2 * num_per_channels) == 0, f"{SB}:199", "x.size(-1) % (2 * num_per_channels) == 0")
    hidden = data.size(-1) // 2
    data, grad_out = data.view(-1, hidden * 2), grad_out.view(-1, hidden)
    rows = data.size(0)
    tokens, topk = token_topk_to_pos.shape
    check(tuple(x_sf.shape) == (rows, 2 * hidden // num_per_channels), f"{SB}:207",
          "x_sf.shape == (num_expand_tokens, 2 * hidden // num_per_channels)")  # fmt: skip
    check(tuple(grad_out.shape) == (rows, hidden), f"{SB}:208", "grad_out.shape == (num_expand_tokens, hidden)")
    check(tuple(weight.shape) == (tokens, topk), f"{SB}:209", "weight.shape == (num_tokens, num_topk)")
    check(tuple(pos_to_token_topk.shape) == (rows,), f"{SB}:210", "pos_to_token_topk.shape == (num_expand_tokens, )")
    check(tuple(token_topk_to_pos.shape) == (tokens, topk), f"{SB}:211",
          "token_topk_to_pos.shape == (num_tokens, num_topk)")  # fmt: skip
    # T.Tensor argument types: grad_out is read as BF16, the scales and weights as FP32, the maps as int32.
    for name, t, dtype in (("grad_out", grad_out, torch.bfloat16), ("x_sf", x_sf, torch.float32),
                           ("weight", weight, torch.float32), ("pos_to_token_topk", pos_to_token_topk, torch.int32),
                           ("token_topk_to_pos", token_topk_to_pos, torch.int32)):  # fmt: skip
        if t.dtype != dtype:
            raise Panic(f"{name}: a {t.dtype} tensor read by the kernel as {dtype}")
    index = pos_to_token_topk.long()
    if bool((index >= tokens * topk).any()):
        raise Panic("pos_to_token_topk past weight: the kernel reads out of bounds")
    w = torch.where(index >= 0, weight.reshape(-1)[index.clamp(0, max(tokens * topk - 1, 0))], 0.0)
    values = data.float() * x_sf.repeat_interleave(num_per_channels, dim=1)
    a, b = values[:, :hidden], values[:, hidden:]
    clamped_a = clamped_b = torch.zeros_like(a, dtype=torch.bool)
    if swiglu_clamp_value is not None:
        c = torch.tensor(swiglu_clamp_value, dtype=torch.float32)
        clamped_a, upper, lower = a > c, b > c, b < -c
        clamped_b = upper | lower
        a = torch.where(clamped_a, c, a)
        b = torch.where(upper, c, torch.where(lower, -c, b))
    g = grad_out.float()
    tmp = 1 + torch.exp(-a)
    act = a / tmp * b
    s = 1.0 / tmp
    gws = g * w[:, None] * s
    da = torch.where(clamped_a, 0.0, gws * b * fma(a, 1 - s, 1.0))
    db = torch.where(clamped_b, 0.0, gws * a)
    x_grad = torch.cat([da, db], dim=1)
    q, q_sf = _ref.kernel_cast(x_grad, "e4m3", (1, num_per_channels), round_sf)
    # weight_grad: 0 where token_topk_to_pos is -1, the row's sum where a row points at the slot, else unwritten
    weight_grad = torch.full((tokens, topk), float("nan"), dtype=torch.float32)
    flat = weight_grad.view(-1)
    flat[(token_topk_to_pos.reshape(-1) == -1)] = 0.0
    sums = (g * act).sum(dim=1)
    mapped = index >= 0
    flat[index[mapped]] = sums[mapped]
    return (act * w[:, None]).to(torch.bfloat16), (q, q_sf), x_grad.to(torch.bfloat16), weight_grad


swiglu_forward_and_per_token_cast = v1_swiglu_forward_and_per_token_cast
swiglu_backward_and_per_token_cast = v1_swiglu_backward_and_per_token_cast


def _not_modelled(name):
    def function(*args, **kwargs):
        record(name)
        raise NotImplementedError(f"tile_kernels stand-in: quant.{name} is not modelled")

    function.__name__ = name
    return function


per_channel_cast_fused = _not_modelled("per_channel_cast_fused")
per_channel_cast_and_transpose = _not_modelled("per_channel_cast_and_transpose")
per_block_cast_lossless = _not_modelled("per_block_cast_lossless")
cast_back = _not_modelled("cast_back")
per_token_cast_back = _not_modelled("per_token_cast_back")
swiglu_forward_and_per_channel_cast_and_transpose = _not_modelled("swiglu_forward_and_per_channel_cast_and_transpose")
