"""``tile_kernels.testing.quant``: zeroing the unused bytes of packed UE8M0 scales before a bitwise comparison."""

from __future__ import annotations

import torch

from torch_ascend_moe.tile_kernels.utils import align, ceil_div


def clear_unused_sf(sf: torch.Tensor, hidden: int, num_per_channels: int) -> torch.Tensor:
    """The packed scales' bytes as ``uint8 [rows, align(blocks, 4)]`` with the bytes past the last block zeroed
    (upstream leaves them unspecified)."""
    blocks = ceil_div(hidden, num_per_channels)
    raw = sf.contiguous().flatten().view(torch.uint8)
    flat = raw.view(raw.numel() // align(blocks, 4), align(blocks, 4)).clone()  # not -1: 0 rows have no size
    flat[:, blocks:] = 0
    return flat
