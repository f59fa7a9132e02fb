"""TileKernels' (Ascend era) RMSNorm kernels over the ``rms_norm`` / ``rms_norm_backward`` ops, with upstream's
signatures, asserts (its CUDA limits: hidden a multiple of 16, at most 8192; the backward's of 32) and out-parameters.

``mega_moe_sf`` (the Mega MoE kernel's activation scales, written as the norm casts) takes each token's UE8M0 codes
of its 1x32 blocks, four per int32, at the row the fork's test pins (``get_mega_moe_sf_row``: blocks of ``block_m``
tokens, each ``align(block_m, 128)`` rows, the token's row interleaved within 128). With 3-D ``x`` the
column-major scale layouts are laid out per batch (the values upstream's are; its single shared allocation's
strides differ).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.ops.norm import rms_norm, rms_norm_backward, rms_norm_quant
from torch_ascend_moe.quant.encodings import pack_ue8m0_to_int
from torch_ascend_moe.tile_kernels.quant import _layout

__all__ = [
    "add_rmsnorm_forward_and_per_token_cast",
    "norm_backward",
    "norm_forward",
    "norm_forward_and_per_token_cast",
    "rmsnorm_forward_and_per_token_cast",
]


def _check_forward(x, weight, residual, hidden_multiple: int = 16) -> None:
    assert x.ndim in (2, 3) and x.dtype in (torch.bfloat16, torch.float32) and x.stride(-1) == 1
    hidden = x.shape[-1]
    assert hidden > 0 and hidden % hidden_multiple == 0 and hidden <= 8192
    if weight is not None:
        assert weight.shape == (hidden,) and weight.dtype == x.dtype and weight.device == x.device
        assert weight.is_contiguous()
    if residual is not None:
        assert residual.shape == x.shape and residual.dtype == x.dtype and residual.device == x.device


def _store(buffer, value):
    if buffer is None:
        return value
    assert buffer.shape == value.shape and buffer.dtype == value.dtype and buffer.device == value.device
    return buffer.copy_(value)


def norm_forward(x: torch.Tensor, weight, eps: float, residual=None, out_scale: float = 1.0, out=None,
                 residual_out=None):  # fmt: skip
    """``(out, rstd, norm_input)``: RMSNorm of ``x (+ residual)``; ``norm_input`` is ``x`` itself without a residual
    (upstream's alias), else the rounded sum (in ``residual_out`` when given)."""
    _check_forward(x, weight, residual)
    y, rstd, s = rms_norm(x, weight, eps, residual=residual, out_scale=out_scale)
    norm_input = x if residual is None else _store(residual_out, s)
    return _store(out, y), rstd, norm_input


def norm_forward_and_per_token_cast(x: torch.Tensor, weight, eps: float, fmt: str, num_per_channels: int,
                                    residual=None, out_scale: float = 1.0, use_tma_aligned_col_major_sf: bool = False,
                                    round_sf: bool = False, use_packed_ue8m0: bool = False, with_out_bf16: bool = False,
                                    out=None, out_bf16=None, residual_out=None, mega_moe_sf=None,
                                    mega_moe_block_m: int = 0):  # fmt: skip
    """``((out_fp8, out_sf), out_bf16, rstd, norm_input)``: the per-token E4M3 cast (blocks of 32 or 128) of the RMSNorm
    output rounded to x's dtype, i.e. ``per_token_cast(norm_forward(...)[0])``; ``out_bf16`` the normalized output in
    BF16 when ``with_out_bf16`` (else None)."""
    _check_forward(x, weight, residual)
    assert fmt == "e4m3" and num_per_channels in (32, 128), "fmt must be 'e4m3' with num_per_channels 32 or 128"
    assert x.shape[-1] % num_per_channels == 0
    assert (mega_moe_sf is None) == (mega_moe_block_m == 0)
    if mega_moe_sf is not None:
        assert x.ndim == 2 and num_per_channels == 32 and round_sf and x.shape[-1] % 128 == 0
        assert mega_moe_sf.dtype == torch.int32 and mega_moe_sf.shape[-1] == x.shape[-1] // 128
    assert out_bf16 is None or with_out_bf16
    data, sf, y, rstd, s = rms_norm_quant(
        x, weight, eps, residual=residual, out_scale=out_scale, num_per_channels=num_per_channels, round_sf=round_sf
    )
    raw_sf = sf
    if x.ndim == 2:
        sf = _layout(sf, use_tma_aligned_col_major_sf, use_packed_ue8m0)
    else:
        sf = torch.stack([_layout(part, use_tma_aligned_col_major_sf, use_packed_ue8m0) for part in sf])
    if out is not None:
        out_data, out_sf = out  # an out_sf of None: the scales are allocated (any layout)
        assert out_sf is None or not use_tma_aligned_col_major_sf, "External buffers only support row-major SF"
        data, sf = _store(out_data, data), _store(out_sf, sf)
    if mega_moe_sf is not None:
        _write_mega_moe_sf(mega_moe_sf, raw_sf, mega_moe_block_m)
    norm_input = x if residual is None else _store(residual_out, s)
    bf16 = _store(out_bf16, y.bfloat16()) if with_out_bf16 else None
    return (data, sf), bf16, rstd, norm_input


def _write_mega_moe_sf(buffer: torch.Tensor, sf: torch.Tensor, block_m: int) -> None:
    """Token ``t``'s UE8M0 codes (4 per int32, little-endian) into row ``t // m * align(m, 128) + i // 128 * 128 +
    i % 32 * 4 + i % 128 // 32`` (``i = t % m``) of ``buffer``: rows past its own size, in its storage, as the kernel
    writes through its pointer and strides."""
    t = sf.shape[0]
    if t == 0:
        return
    token = torch.arange(t, device=sf.device)
    i = token % block_m
    row = token // block_m * (-(-block_m // 128) * 128) + i // 128 * 128 + i % 32 * 4 + i % 128 // 32
    words = pack_ue8m0_to_int(sf)  # [T, H / 128]: 4 codes a word, code j in byte j
    span = int(row.max()) + 1
    target = buffer.as_strided((span, buffer.shape[1]), buffer.stride(), buffer.storage_offset())
    target[row] = words


def _overlap(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    """Whether two tensors' memory spans intersect (same storage, overlapping byte ranges)."""
    if a is None or b is None or a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t):
        extent = sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride())) + 1
        return t.data_ptr(), t.data_ptr() + extent * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def add_rmsnorm_forward_and_per_token_cast(x: torch.Tensor, residual: torch.Tensor, weight, eps: float, fmt: str,
                                           num_per_channels: int, use_tma_aligned_col_major_sf: bool = False,
                                           round_sf: bool = False, use_packed_ue8m0: bool = False):  # fmt: skip
    """The Ascend era's fused add + RMSNorm + cast: ``residual`` becomes ``x + residual`` (in place, rounded to its
    dtype) and ``(data, sf)``, the per-token cast of the sum's RMSNorm, is returned; ``x``, ``residual`` and
    ``weight`` must not share memory."""
    assert not _overlap(x, residual) and not _overlap(weight, residual) and not _overlap(weight, x), (
        "x, residual and weight must not overlap"
    )
    return norm_forward_and_per_token_cast(
        x, weight, eps, fmt, num_per_channels, residual=residual, residual_out=residual,
        use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf, round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0,
    )[0]  # fmt: skip


def norm_backward(out_grad: torch.Tensor, x: torch.Tensor, weight, rstd: torch.Tensor, residual_out_grad=None,
                  out_scale: float = 1.0, weight_grad=None):  # fmt: skip
    """``(x_grad, weight_grad)`` from ``norm_forward``'s ``norm_input`` and ``rstd``; a given ``weight_grad`` buffer
    is accumulated into and returned."""
    assert x.ndim == 2 and x.dtype in (torch.bfloat16, torch.float32) and x.stride(-1) == 1
    hidden = x.shape[1]
    assert 0 < hidden <= 8192 and hidden % 32 == 0, "hidden_size must be a multiple of 32 in [32, 8192]"
    assert out_grad.shape == x.shape and out_grad.dtype == x.dtype and out_grad.device == x.device
    assert rstd.shape == (x.shape[0],) and rstd.dtype == torch.float32 and rstd.is_contiguous()
    if residual_out_grad is not None:
        assert residual_out_grad.shape == x.shape and residual_out_grad.dtype == x.dtype
    if weight is not None:
        assert weight.shape == (hidden,) and weight.dtype == x.dtype and weight.is_contiguous()
    if weight_grad is not None:
        assert weight is not None
        assert weight_grad.shape == weight.shape and weight_grad.dtype in (torch.bfloat16, torch.float32)
    x_grad, w_grad = rms_norm_backward(
        out_grad, x, weight, rstd, residual_out_grad=residual_out_grad, out_scale=out_scale
    )
    if weight is None:
        return x_grad, None
    if weight_grad is None:
        return x_grad, w_grad.to(weight.dtype)
    weight_grad.copy_((weight_grad.float() + w_grad).to(weight_grad.dtype))
    return x_grad, weight_grad


def rmsnorm_forward_and_per_token_cast(x: torch.Tensor, weight: torch.Tensor, eps: float, fmt: str,
                                       num_per_channels: int, use_tma_aligned_col_major_sf: bool = False,
                                       round_sf: bool = False, use_packed_ue8m0: bool = False):  # fmt: skip
    """``(out_e4m3 [T, H], out_sf)``: TileKernels' fused RMSNorm and per-token cast (9375f83,
    ``quant/rmsnorm_forward_and_per_token_cast_kernel.py``): the normalized row **kept in FP32** (``float(x)`` times
    ``rstd = rsqrt(Σ float(x)²/H + eps)`` times ``float(w)``, never rounded to x's dtype), cast in ``1 ×
    num_per_channels`` blocks (128 or the whole row) exactly as ``per_token_cast`` casts, scale layouts and flags
    included. Not ``norm_forward_and_per_token_cast``, which casts the x-dtype-rounded output in blocks of 32. The
    product's FP32 order may differ from the kernel's by an ulp (its own test allows a few FP8 codes apart)."""
    from torch_ascend_moe.tile_kernels.quant import per_token_cast

    assert x.dim() == 2 and x.dtype in (torch.bfloat16, torch.float32) and x.is_contiguous()
    hidden = x.shape[1]
    assert weight.shape == (hidden,) and weight.dtype == x.dtype and weight.is_contiguous()
    assert hidden % 128 == 0 and fmt == "e4m3" and num_per_channels in (128, hidden)
    assert not use_tma_aligned_col_major_sf or num_per_channels == 128
    normalized, _, _ = rms_norm(x.float(), weight.float(), eps)
    return per_token_cast(normalized, fmt, num_per_channels, use_tma_aligned_col_major_sf=use_tma_aligned_col_major_sf,
                          round_sf=round_sf, use_packed_ue8m0=use_packed_ue8m0)  # fmt: skip
