"""``deep_gemm.utils.layout``: the TMA-aligned scale layouts and the contiguous-layout alignment settings,
under upstream's module path (the functions live in ``deep_gemm.layout`` / ``deep_gemm.runtime``)."""

from torch_ascend_moe.deep_gemm.layout import (
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
)
from torch_ascend_moe.deep_gemm.runtime import (
    get_k_alignment_for_contiguous_layout,
    get_m_alignment_for_contiguous_layout,
    get_mk_alignment_for_contiguous_layout,
    get_theoretical_mk_alignment_for_contiguous_layout,
    set_mk_alignment_for_contiguous_layout,
)
from torch_ascend_moe.deep_gemm.utils.math import get_tma_aligned_size  # noqa: F401  (upstream path; star-exported via math)

__all__ = [
    "get_k_alignment_for_contiguous_layout",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_m_alignment_for_contiguous_layout",
    "get_mk_alignment_for_contiguous_layout",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_mn_major_tma_aligned_tensor",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "set_mk_alignment_for_contiguous_layout",
]
