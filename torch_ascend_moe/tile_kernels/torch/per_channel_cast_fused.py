"""``tile_kernels.torch.per_channel_cast_fused``: upstream's reference name (positional ``num_per_channels``)."""

from __future__ import annotations

from torch_ascend_moe.tile_kernels.quant import per_channel_cast_fused as _fused

__all__ = ["per_channel_cast_fused"]


def per_channel_cast_fused(x, num_per_tokens: int, num_per_channels, round_sf: bool, pos_to_token):
    return _fused(x, "e4m3", num_per_tokens, round_sf, num_per_channels, pos_to_token)
