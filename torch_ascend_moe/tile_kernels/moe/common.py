"""Upstream's ``tile_kernels/moe/common.py`` holds only a TileLang macro (``get_topk_group_idx``, private to its
gate kernels): the path imports, and the group selection is ``tile_kernels.moe.topk_sum_and_topk_group_idx``."""
