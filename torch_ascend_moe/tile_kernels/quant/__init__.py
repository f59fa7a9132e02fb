"""``tile_kernels.quant``: TileKernels' casts (the ``quantize_blocks`` op for the codes and scales, ``dequantize`` for
QuantTensor inputs and ``cast_back``), with upstream's signatures, asserts and scale-factor layouts:

- default: FP32 ``sf`` row-major ``[ceil(rows / bh), ceil(cols / bw)]``;
- ``use_tma_aligned_col_major_sf``: the same values column-major, the row count padded to 4 in the allocation;
- ``use_packed_ue8m0`` (with the column-major layout, power-of-two scales): the exponent bytes of 4 consecutive
  column blocks in one int32 (little-endian), column-major, rows padded to 4 (unused bytes zero); on Ascend
  (``config.is_ascend()`` or NPU tensors) two per int16, as the Ascend-era TileKernels packs them.

A QuantTensor is a ``(data, sf)`` tuple; FP4 data is int8 as upstream (uint8 accepted); E5M6 (``fmt='e5m6'``, per-row
scales) is packed uint8 ``[T, 3H / 2]``. The fused SwiGLU and norm kernels live in ``quant.swiglu`` / ``quant.norm``.
``per_channel_cast_fused`` gathers rows and dequantizes a QuantTensor before the per-channel cast.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from torch_ascend_moe.ops.quant import dequantize, quantize_blocks
from torch_ascend_moe.quant.encodings import decode_e2m1, decode_e5m6, unpack_e2m1, unpack_e5m6

__all__ = [
    "cast_back",
    "per_channel_cast_and_transpose",
    "per_channel_cast_fused",
    "swiglu_forward_and_per_channel_cast_and_transpose",
    "add_rmsnorm_forward_and_per_token_cast",
    "norm_backward",
    "norm_forward",
    "norm_forward_and_per_token_cast",
    "rmsnorm_forward_and_per_token_cast",
    "swiglu_backward",
    "swiglu_backward_and_per_token_cast",
    "swiglu_forward",
    "swiglu_forward_and_per_token_cast",
    "per_block_cast",
    "per_block_cast_lossless",
    "per_block_cast_with_precomputed_sf",
    "per_block_cast_with_sf_only",
    "per_channel_cast",
    "per_token_cast",
    "per_token_cast_back",
    "per_token_cast_with_precomputed_sf",
    "per_token_cast_with_sf_only",
    "unpack_from_e2m1fn_x2",
]

_FORMATS = ("e4m3", "e2m1", "e5m6")


def _align(n: int, a: int) -> int:
    return -(-n // a) * a


def _sf_as_float(sf: torch.Tensor) -> torch.Tensor:
    """A given sf as FP32 values: FP32 as is (any layout), packed UE8M0 int32 decoded byte by byte."""
    if sf.dtype == torch.float32:
        return sf
    assert sf.dtype in (torch.int32, torch.int16), f"sf must be float32 or packed UE8M0 int32/int16, got {sf.dtype}"
    per_row = sf.shape[1] * sf.element_size() if sf.dim() == 2 else -1  # -1 cannot be inferred at 0 rows
    codes = sf.contiguous().view(torch.uint8).view(sf.shape[0], per_row).to(torch.int32)
    return (codes << 23).view(torch.float32)


def _input(x, x_block_size) -> torch.Tensor:
    """A plain tensor, or a QuantTensor dequantized to FP32 with its block size."""
    if not isinstance(x, tuple):
        assert x.dtype in (torch.bfloat16, torch.float32), f"x must be bfloat16 or float32, got {x.dtype}"
        return x
    data, sf = x
    assert x_block_size is not None, "a QuantTensor input needs x_block_size"
    assert data.dtype in (torch.float8_e4m3fn, torch.int8, torch.uint8), f"unsupported data dtype {data.dtype}"
    if data.dtype == torch.int8:
        data = data.view(torch.uint8)
    values = _sf_as_float(sf)
    cols = data.shape[1] * (2 if data.dtype == torch.uint8 else 1)
    values = values[
        : _align(data.shape[0], x_block_size[0]) // x_block_size[0], : _align(cols, x_block_size[1]) // x_block_size[1]
    ]
    return dequantize(data, values.contiguous(), tuple(x_block_size))


def packed_sf_dtype(device: torch.device) -> torch.dtype:
    """The packed UE8M0 word: int16 (two exponents) on Ascend, int32 (four) elsewhere, as TileKernels packs them."""
    from torch_ascend_moe.tile_kernels.config import is_ascend

    return torch.int16 if device.type == "npu" or is_ascend() else torch.int32


def _layout(sf: torch.Tensor, col_major: bool, packed: bool) -> torch.Tensor:
    if packed:
        assert col_major, "use_packed_ue8m0 needs use_tma_aligned_col_major_sf"
    if not col_major:
        return sf
    rows, cols = sf.shape
    word = packed_sf_dtype(sf.device) if packed else torch.float32
    per_word = {torch.int32: 4, torch.int16: 2}.get(word, 1)
    padded = F.pad(sf, (0, _align(cols, per_word) - cols, 0, _align(rows, 4) - rows))
    if packed:
        bits = padded.view(torch.int32)
        assert bool(((bits & 0x807FFFFF) == 0).all()), "use_packed_ue8m0 needs power-of-two scales (round_sf=True)"
        padded = (bits >> 23).to(torch.uint8).view(word)
    return padded.T.contiguous().T[:rows]


def _data(data: torch.Tensor, fmt: str) -> torch.Tensor:
    return data.view(torch.int8) if fmt == "e2m1" else data


def _cast(x, fmt, block, x_block_size, col_major, round_sf, packed, sf=None):
    assert fmt in _FORMATS, f"fmt must be one of {_FORMATS} here, got {fmt!r}"
    values = _input(x, x_block_size)
    assert values.dim() == 2, "only 2-D tensors are supported"
    if sf is not None:
        assert not packed and not col_major, "a precomputed sf is row-major FP32"
    data, scale = quantize_blocks(values, fmt, block, round_sf=round_sf, sf=sf)
    return _data(data, fmt), _layout(scale, col_major, packed)


def _token_block(x, num_per_channels: int) -> tuple[int, int]:
    hidden = (
        (x[0].shape[1] * (2 if x[0].dtype in (torch.int8, torch.uint8) else 1)) if isinstance(x, tuple) else x.shape[1]
    )
    assert num_per_channels in (16, 32, 64, 128) or (num_per_channels == hidden and hidden % 64 == 0), (
        f"num_per_channels must be 16, 32, 64, 128 or the hidden size (a multiple of 64), got {num_per_channels}"
    )
    return 1, num_per_channels


def per_token_cast(x, fmt: str, num_per_channels: int, x_block_size=None, use_tma_aligned_col_major_sf: bool = False,
                   round_sf: bool = False, use_packed_ue8m0: bool = False):  # fmt: skip
    """``(data, sf)``: ``x`` (or a QuantTensor) cast in ``1 × num_per_channels`` blocks."""
    return _cast(x, fmt, _token_block(x, num_per_channels), x_block_size, use_tma_aligned_col_major_sf, round_sf,
                 use_packed_ue8m0)  # fmt: skip


def per_token_cast_with_sf_only(x, fmt: str, num_per_channels: int, x_block_size=None,
                                use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                use_packed_ue8m0: bool = False) -> torch.Tensor:  # fmt: skip
    return per_token_cast(x, fmt, num_per_channels, x_block_size, use_tma_aligned_col_major_sf, round_sf,
                          use_packed_ue8m0)[1]  # fmt: skip


def per_token_cast_with_precomputed_sf(x, fmt: str, num_per_channels: int, sf: torch.Tensor, x_block_size=None,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False) -> torch.Tensor:  # fmt: skip
    return _cast(x, fmt, _token_block(x, num_per_channels), x_block_size, False, False, False,
                 sf=_sf_as_float(sf).contiguous())[0]  # fmt: skip


def per_block_cast(x, fmt: str, block_size, use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                   use_packed_ue8m0: bool = False, x_block_size=None):  # fmt: skip
    """``(data, sf)``: ``x`` cast in ``block_size`` blocks (a contiguous 2-D BF16/FP32 tensor, hidden % 64 == 0)."""
    if not isinstance(x, tuple):
        assert x.is_contiguous() and x.shape[1] % 64 == 0, "per_block_cast needs a contiguous x with hidden % 64 == 0"
    return _cast(x, fmt, tuple(block_size), x_block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)


def per_block_cast_with_sf_only(x, fmt: str, block_size, use_tma_aligned_col_major_sf: bool = False,
                                round_sf: bool = False, use_packed_ue8m0: bool = False) -> torch.Tensor:  # fmt: skip
    return per_block_cast(x, fmt, block_size, use_tma_aligned_col_major_sf, round_sf, use_packed_ue8m0)[1]


def per_block_cast_with_precomputed_sf(x, fmt: str, block_size, sf: torch.Tensor,
                                       use_tma_aligned_col_major_sf: bool = False, round_sf: bool = False,
                                       use_packed_ue8m0: bool = False) -> torch.Tensor:  # fmt: skip
    assert sf.dtype == torch.float32 and sf.stride(-1) == 1, "a precomputed sf is row-major FP32"
    return _cast(x, fmt, tuple(block_size), None, False, False, False, sf=sf.contiguous())[0]


def per_channel_cast(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False):
    """``(data, sf FP32 [T / num_per_tokens, H])``: ``x`` cast in ``num_per_tokens × 1`` blocks (E4M3)."""
    assert fmt == "e4m3" and num_per_tokens == 128, "per_channel_cast supports e4m3 with num_per_tokens == 128"
    assert x.shape[0] % 128 == 0 and x.shape[1] % 64 == 0, "per_channel_cast needs T % 128 == 0 and H % 64 == 0"
    return _cast(x, fmt, (num_per_tokens, 1), None, False, round_sf, False)


def per_channel_cast_and_transpose(x: torch.Tensor, fmt: str, num_per_tokens: int, round_sf: bool = False):
    """``(data [H, T], sf FP32 [T / num_per_tokens, H])``: the per-channel E4M3 cast of a BF16 ``x [T, H]``, its codes
    transposed."""
    assert x.dim() == 2 and x.is_contiguous() and x.dtype == torch.bfloat16
    assert fmt == "e4m3" and x.shape[0] % 128 == 0 and x.shape[1] % 64 == 0 and num_per_tokens in (32, 128)
    data, sf = _cast(x, fmt, (num_per_tokens, 1), None, False, round_sf, False)
    return data.T.contiguous(), sf


def per_channel_cast_fused(x, fmt: str, num_per_tokens: int, round_sf: bool = False, num_per_channels=None,
                           pos_to_token: torch.Tensor | None = None):  # fmt: skip
    """The per-channel E4M3 cast (blocks of ``num_per_tokens`` rows) of ``x``, or of an FP8 QuantTensor with
    ``1 × num_per_channels`` scales (dequantized first), its rows optionally gathered by ``pos_to_token`` (-1: a
    zero row)."""
    quantized = isinstance(x, tuple)
    data = x[0] if quantized else x
    assert fmt == "e4m3" and data.dim() == 2 and data.is_contiguous()
    rows = data.shape[0]
    if pos_to_token is not None:
        assert pos_to_token.dim() == 1 and pos_to_token.is_contiguous() and pos_to_token.dtype == torch.int32
        rows = pos_to_token.shape[0]
        assert rows % 16 == 0
    else:
        assert rows % 128 == 0
    assert num_per_tokens == 128
    if quantized:
        assert num_per_channels == 128 and data.dtype == torch.float8_e4m3fn
        assert x[1].dim() == 2 and x[1].is_contiguous() and x[1].shape[1] * 128 == data.shape[1]
    if pos_to_token is not None:
        take = pos_to_token.long().clamp(min=0)
        keep = (pos_to_token >= 0)[:, None]
        data = torch.where(keep, data[take].float(), 0).to(data.dtype)
        if quantized:
            x = (data, torch.where(keep, x[1][take], 0))
        else:
            x = data
    block = (1, num_per_channels) if quantized else None
    return _cast(x, fmt, (num_per_tokens, 1), block, False, round_sf, False)


def per_block_cast_lossless(x, fmt: str, x_block_size, out_block_size, use_tma_aligned_col_major_sf: bool = False,
                            round_sf: bool = False, use_packed_ue8m0: bool = False):  # fmt: skip
    """An FP4 QuantTensor with power-of-two scales re-cast to E4M3 ``out_block_size`` blocks without loss, by
    upstream's exponent rule: an output block's scale is its largest input scale / 2^6 (exponent floored at the
    code 0, read as 0.0), each FP4 value is multiplied by its input scale / the output scale (exact) and stored in
    E4M3. Lossless while every input scale is at least the output scale / 2^5 (asserted, as upstream's kernel);
    ``round_sf`` changes nothing (the scales are powers of two by construction)."""
    assert isinstance(x, tuple) and x[0].dtype in (torch.int8, torch.uint8) and fmt == "e4m3"
    (bm_in, bk_in), (bm, bk) = tuple(x_block_size), tuple(out_block_size)
    assert bm % bm_in == 0 and bk % bk_in == 0, "Output block size must be multiple of input block size"
    data, sf = x
    values = decode_e2m1(unpack_e2m1(data.view(torch.uint8)))
    m, k = values.shape
    rows_in, cols_in = -(-m // bm_in), -(-k // bk_in)
    # The input scales' biased exponents (FP32 bits >> 23, or the packed bytes), on the input blocks that exist.
    codes = (_sf_as_float(sf)[:rows_in, :cols_in].contiguous().view(torch.int32) >> 23) & 0xFF
    rm, rk = bm // bm_in, bk // bk_in
    rows, cols = -(-rows_in // rm), -(-cols_in // rk)
    padded = F.pad(codes, (0, cols * rk - cols_in, 0, rows * rm - rows_in), value=0)
    out_codes = (padded.view(rows, rm, cols, rk).amax(dim=(1, 3)) - 6).clamp(min=0)
    spread = out_codes.repeat_interleave(rm, 0).repeat_interleave(rk, 1)[:rows_in, :cols_in]
    assert bool((codes + 5 >= spread).all()), "per_block_cast_lossless: an input scale is below output scale / 2^5"
    factor = ((codes - spread + 127) << 23).view(torch.float32)
    factor = factor.repeat_interleave(bm_in, 0).repeat_interleave(bk_in, 1)[:m, :k]
    out = (values * factor).to(torch.float8_e4m3fn)
    return out, _layout((out_codes << 23).view(torch.float32), use_tma_aligned_col_major_sf, use_packed_ue8m0)


def cast_back(x, fmt: str, x_block_size, x_special_fmt=None) -> torch.Tensor:
    """A QuantTensor dequantized to ``fmt`` (``'bf16'`` or ``'fp32'``); ``x_special_fmt='e5m6'`` reads packed E5M6
    data (uint8 ``[T, 3H / 2]``) with per-token scales."""
    assert fmt in ("bf16", "fp32"), f"fmt must be 'bf16' or 'fp32', got {fmt!r}"
    if x_special_fmt is not None:
        assert x_special_fmt == "e5m6", f"x_special_fmt must be None or 'e5m6', got {x_special_fmt!r}"
        values = _e5m6_values(x, x_block_size)
    else:
        values = _input(x, x_block_size)
    return values.to(torch.bfloat16 if fmt == "bf16" else torch.float32)


def _e5m6_values(x, x_block_size) -> torch.Tensor:
    data, sf = x
    assert data.dim() == 2 and data.dtype == torch.uint8
    hidden = data.shape[1] * 2 // 3
    bm, bn = x_block_size
    assert hidden % bn == 0
    scales = _sf_as_float(sf)[:, : hidden // bn]
    scales = scales.repeat_interleave(bm, 0).repeat_interleave(bn, 1)[: data.shape[0], :hidden]
    return decode_e5m6(unpack_e5m6(data)) * scales


def per_token_cast_back(x, fmt: str, num_per_channels: int, x_special_fmt=None) -> torch.Tensor:
    return cast_back(x, fmt, (1, num_per_channels), x_special_fmt)


def unpack_from_e2m1fn_x2(x: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Packed FP4 (int8/uint8, two codes per byte, low nibble first) decoded: ``[..., K] -> [..., 2K]``."""
    assert x.dtype in (torch.int8, torch.uint8)
    if x.dim() == 0:
        raise ValueError("x must have at least 1 dimension so the last dim can be doubled")
    return decode_e2m1(unpack_e2m1(x)).to(out_dtype)


# After the cast helpers: the fused SwiGLU and norm kernels lay their scales out with ``_layout``.
from torch_ascend_moe.tile_kernels.quant.norm import (  # noqa: E402
    add_rmsnorm_forward_and_per_token_cast,
    norm_backward,
    norm_forward,
    norm_forward_and_per_token_cast,
    rmsnorm_forward_and_per_token_cast,
)
from torch_ascend_moe.tile_kernels.quant.swiglu import (  # noqa: E402
    swiglu_backward,
    swiglu_backward_and_per_token_cast,
    swiglu_forward,
    swiglu_forward_and_per_channel_cast_and_transpose,
    swiglu_forward_and_per_token_cast,
)
