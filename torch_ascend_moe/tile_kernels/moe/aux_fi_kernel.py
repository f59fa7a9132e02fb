"""Upstream's ``tile_kernels/moe/aux_fi_kernel.py``, for code importing it: ``tile_kernels.moe``'s ``aux_fi``."""

from torch_ascend_moe.tile_kernels.moe import aux_fi

__all__ = ["aux_fi"]
