"""``deep_gemm.utils``: the helpers upstream star-exports at the top level."""

from torch_ascend_moe.deep_gemm.utils.math import (
    align,
    cast_back_from_fp4,
    ceil_div,
    ceil_to_ue8m0,
    get_tma_aligned_size,
    pack_ue8m0_to_int,
    per_block_cast_to_fp8,
    per_channel_cast_to_fp8,
    per_custom_dims_cast_to_fp8,
    per_token_cast_to_fp4,
    per_token_cast_to_fp8,
    transpose_packed_fp4,
    unpack_ue8m0_from_int,
)

__all__ = [
    "align",
    "cast_back_from_fp4",
    "ceil_div",
    "ceil_to_ue8m0",
    "get_tma_aligned_size",
    "pack_ue8m0_to_int",
    "per_block_cast_to_fp8",
    "per_channel_cast_to_fp8",
    "per_custom_dims_cast_to_fp8",
    "per_token_cast_to_fp4",
    "per_token_cast_to_fp8",
    "transpose_packed_fp4",
    "unpack_ue8m0_from_int",
]
