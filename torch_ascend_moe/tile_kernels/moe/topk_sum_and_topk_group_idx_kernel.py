"""Upstream's ``tile_kernels/moe/topk_sum_and_topk_group_idx_kernel.py``, for code importing it: the functions are
``tile_kernels.moe``'s."""

from torch_ascend_moe.tile_kernels.moe import topk_sum_and_topk_group_idx

__all__ = ["topk_sum_and_topk_group_idx"]
