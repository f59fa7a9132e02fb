"""DeepGEMM(-Ascend)-compatible API over torch.ops.ascend_moe: code written for ``import deep_gemm`` runs
unchanged with ``import torch_ascend_moe.deep_gemm as deep_gemm``.

Functions keep upstream's signatures and out-parameter semantics (they write ``d`` and return None);
the math lives in the ops, so every call also works under torch.compile and autograd-free export.
"""

from torch_ascend_moe.deep_gemm import epilogue, testing, utils
from torch_ascend_moe.deep_gemm.fp8_gemm import (
    fp8_bmm,
    fp8_einsum,
    fp8_fp4_gemm_nn,
    fp8_fp4_gemm_nt,
    fp8_fp4_gemm_tn,
    fp8_fp4_gemm_tt,
    fp8_gemm_nn,
    fp8_gemm_nt,
    fp8_gemm_tn,
    fp8_gemm_tt,
)
from torch_ascend_moe.deep_gemm.gemm import (
    aclnn_bf16_gemm_nn,
    aclnn_bf16_gemm_nt,
    aclnn_bf16_gemm_tn,
    aclnn_bf16_gemm_tt,
    bf16_bmm,
    bf16_gemm_nn,
    bf16_gemm_nt,
    bf16_gemm_tn,
    bf16_gemm_tt,
    cublaslt_gemm_nn,
    cublaslt_gemm_nt,
    cublaslt_gemm_tn,
    cublaslt_gemm_tt,
    einsum,
)
from torch_ascend_moe.deep_gemm.layout import (
    get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_packed_ue8m0_tensor,
    get_mn_major_tma_aligned_tensor,
    transform_sf_into_required_layout,
)
from torch_ascend_moe.deep_gemm.runtime import (
    get_deterministic_algorithms,
    get_mk_alignment_for_contiguous_layout,
    get_num_sms,
    get_pdl,
    get_tc_util,
    get_theoretical_mk_alignment_for_contiguous_layout,
    set_block_size_multiple_of,
    set_ignore_compile_dims,
    set_mk_alignment_for_contiguous_layout,
    set_num_sms,
    set_pdl,
    set_tc_util,
    use_deterministic_algorithms,
)
from torch_ascend_moe.deep_gemm.utils.math import *  # noqa: F403  (upstream's star export)

__version__ = "2.6.1+ascend_moe"

__all__ = utils.math.__all__ + [
    "aclnn_bf16_gemm_nn",
    "aclnn_bf16_gemm_nt",
    "aclnn_bf16_gemm_tn",
    "aclnn_bf16_gemm_tt",
    "bf16_bmm",
    "bf16_gemm_nn",
    "bf16_gemm_nt",
    "bf16_gemm_tn",
    "bf16_gemm_tt",
    "cublaslt_gemm_nn",
    "cublaslt_gemm_nt",
    "cublaslt_gemm_tn",
    "cublaslt_gemm_tt",
    "einsum",
    "epilogue",
    "fp8_bmm",
    "fp8_einsum",
    "fp8_fp4_gemm_nn",
    "fp8_fp4_gemm_nt",
    "fp8_fp4_gemm_tn",
    "fp8_fp4_gemm_tt",
    "fp8_gemm_nn",
    "fp8_gemm_nt",
    "fp8_gemm_tn",
    "fp8_gemm_tt",
    "get_deterministic_algorithms",
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_mk_alignment_for_contiguous_layout",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor",
    "get_mn_major_tma_aligned_tensor",
    "get_num_sms",
    "get_pdl",
    "get_tc_util",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "set_block_size_multiple_of",
    "set_ignore_compile_dims",
    "set_mk_alignment_for_contiguous_layout",
    "set_num_sms",
    "set_pdl",
    "set_tc_util",
    "testing",
    "transform_sf_into_required_layout",
    "use_deterministic_algorithms",
    "utils",
]
