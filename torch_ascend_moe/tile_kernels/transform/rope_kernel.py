"""The Ascend-era fork's ``tile_kernels/transform/rope_kernel.py``, for code importing it: the functions are
``tile_kernels.transform``'s."""

from torch_ascend_moe.tile_kernels.transform import apply_rotary

__all__ = ["apply_rotary"]
