"""``deep_gemm.utils``: the helpers upstream star-exports at the top level."""

from torch_ascend_moe.deep_gemm.utils.math import align, ceil_div, get_tma_aligned_size

__all__ = ["align", "ceil_div", "get_tma_aligned_size"]
