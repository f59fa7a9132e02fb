"""``tile_kernels.rand.seed``: the seed upstream's random kernels start from, and the per-launch seeds they reserve."""

from __future__ import annotations

import torch

__all__ = ["reserve_seed", "set_seed"]

_seed = [torch.initial_seed()]


def set_seed(seed: int) -> None:
    """Seed torch's generator and the kernels' seed counter."""
    torch.manual_seed(seed)
    _seed[0] = seed


def reserve_seed(num_blocks: int) -> int:
    """A 32-bit seed for a launch of ``num_blocks`` blocks (the counter advances by that many), mixed as upstream
    mixes it (an add of the golden-ratio constant, then two xor-shift-multiply rounds)."""
    seed, _seed[0] = _seed[0], _seed[0] + num_blocks
    seed = (seed + 0x9E3779B9) & 0xFFFFFFFF
    seed = ((seed ^ (seed >> 16)) * 0x21F0AAAD) & 0xFFFFFFFF
    seed = ((seed ^ (seed >> 15)) * 0x735A2D97) & 0xFFFFFFFF
    return (seed ^ (seed >> 15)) & 0xFFFFFFFF
