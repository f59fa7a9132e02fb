"""``tile_kernels.testing.quant``: zeroing the unused bytes of packed UE8M0 scales before a bitwise comparison."""

from __future__ import annotations

import torch

from torch_ascend_moe.tile_kernels.utils import align, ceil_div


def clear_unused_sf(sf: torch.Tensor, hidden: int, num_per_channels: int) -> torch.Tensor:
    """The packed scales' bytes as ``uint8 [rows, align(blocks, 4)]`` with the bytes past the last block zeroed
    (upstream leaves them unspecified)."""
    blocks = ceil_div(hidden, num_per_channels)
    flat = sf.contiguous().flatten().view(torch.uint8).view(-1, align(blocks, 4)).clone()
    flat[:, blocks:] = 0
    return flat
