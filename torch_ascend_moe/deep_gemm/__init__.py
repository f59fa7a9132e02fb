"""DeepGEMM(-Ascend)-compatible API over torch.ops.ascend_moe: code written for ``import deep_gemm`` runs
unchanged with ``import torch_ascend_moe.deep_gemm as deep_gemm``.

Functions keep upstream's signatures and out-parameter semantics (they write ``d`` and return None);
the math lives in the ops, so every call also works under torch.compile and autograd-free export.
"""

from torch_ascend_moe.deep_gemm import epilogue, legacy, testing, utils
from torch_ascend_moe.deep_gemm.fp8_gemm import (
    fp8_bmm,
    fp8_einsum,
    fp8_fp4_gemm_nn,
    fp8_fp4_gemm_nt,
    fp8_fp4_gemm_tn,
    fp8_fp4_gemm_tt,
    fp8_gemm_nn,
    fp8_gemm_nt,
    fp8_gemm_nt_skip_head_mid,
    fp8_gemm_tn,
    fp8_gemm_tt,
)
from torch_ascend_moe.deep_gemm.gemm import (
    aclnn_bf16_gemm_nn,
    aclnn_bf16_gemm_nt,
    aclnn_bf16_gemm_tn,
    aclnn_bf16_gemm_tt,
    batched_symm,
    batched_syrk,
    bf16_bmm,
    bf16_gemm_nn,
    bf16_gemm_nt,
    bf16_gemm_tn,
    bf16_gemm_tt,
    cublaslt_gemm_nn,
    cublaslt_gemm_nt,
    cublaslt_gemm_tn,
    cublaslt_gemm_tt,
    cublaslt_nvfp4_gemm_nt,
    einsum,
)
from torch_ascend_moe.deep_gemm.grouped import (
    bf16_m_grouped_gemm_nt_masked,
    fp8_m_grouped_gemm_nt_masked,
    k_grouped_bf16_gemm_tn_contiguous,
    k_grouped_fp4_gemm_nt_contiguous,
    k_grouped_fp8_gemm_nt_contiguous,
    k_grouped_fp8_gemm_tn_contiguous,
    m_grouped_bf16_gemm_nn_contiguous,
    m_grouped_bf16_gemm_nt_contiguous,
    m_grouped_bf16_gemm_nt_masked,
    m_grouped_fp8_fp4_gemm_nn_contiguous,
    m_grouped_fp8_fp4_gemm_nt_contiguous,
    m_grouped_fp8_fp4_gemm_nt_masked,
    m_grouped_fp8_gemm_nn_contiguous,
    m_grouped_fp8_gemm_nt_contiguous,
    m_grouped_fp8_gemm_nt_masked,
)
from torch_ascend_moe.deep_gemm.hc_prenorm import tf32_hc_prenorm_gemm
from torch_ascend_moe.deep_gemm.layout import transform_sf_into_required_layout
from torch_ascend_moe.deep_gemm.mega import (
    SymmBuffer,
    bf16_mega_moe,
    fp8_fp4_mega_moe,
    get_block_m_for_mega_moe,
    get_symm_buffer_for_mega_moe,
    get_token_alignment_for_mega_moe,
    transform_weights_for_mega_moe,
)
from torch_ascend_moe.deep_gemm.mega_gate import bf16_mega_gate, get_bf16_mega_gate_config
from torch_ascend_moe.deep_gemm.mega_mhc import mega_mhc
from torch_ascend_moe.deep_gemm.mega_sm90 import (
    SM90SymmBuffer,
    fp8_mega_moe,
    get_symm_buffer_for_sm90_mega_moe,
    transform_weights_for_mega_moe_sm90,
)
from torch_ascend_moe.deep_gemm.mqa import (
    fp8_fp4_mqa_logits,
    fp8_fp4_paged_mqa_logits,
    fp8_mqa_logits,
    fp8_paged_mqa_logits,
    get_mqa_logits_metadata,
    get_paged_mqa_logits_metadata,
)
from torch_ascend_moe.deep_gemm.runtime import (
    get_deterministic_algorithms,
    get_num_sms,
    get_pdl,
    get_tc_util,
    set_block_size_multiple_of,
    set_ignore_compile_dims,
    set_num_sms,
    set_pdl,
    set_tc_util,
    use_deterministic_algorithms,
)
from torch_ascend_moe.deep_gemm.sparse_mqa import (
    fp8_fp4_paged_sparse_mqa_logits,
    fp8_fp4_sparse_mqa_logits,
    get_paged_sparse_mqa_logits_metadata,
    get_sparse_mqa_logits_metadata,
)
from torch_ascend_moe.deep_gemm.utils import *  # noqa: F403  (upstream's star export)

# The newest DeepGEMM API implemented: 2.8.0 ("Public Release 26/09": the sparse indexer, Mega Gate, Mega mHC, the FP4
# family, batched_syrk/symm, the FP8-output einsum); 2.6.1's call forms keep working where 2.8 changed them.
__version__ = "2.8.0+ascend_moe"

# DeepGEMM 2.8's FP4 names (``register_apis`` in its ``csrc/apis/gemm.hpp``): the same functions as the FP8/FP4 ones.
fp4_gemm_nt = fp8_fp4_gemm_nt
m_grouped_fp4_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp4_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked

# utils.__all__: upstream's math, layout and dist helpers, star-exported above.
__all__ = utils.__all__ + [
    "aclnn_bf16_gemm_nn",
    "aclnn_bf16_gemm_nt",
    "aclnn_bf16_gemm_tn",
    "aclnn_bf16_gemm_tt",
    "bf16_bmm",
    "bf16_gemm_nn",
    "bf16_gemm_nt",
    "bf16_gemm_tn",
    "bf16_gemm_tt",
    "bf16_m_grouped_gemm_nt_masked",
    "cublaslt_gemm_nn",
    "cublaslt_gemm_nt",
    "cublaslt_gemm_tn",
    "cublaslt_gemm_tt",
    "cublaslt_nvfp4_gemm_nt",
    "batched_syrk",
    "batched_symm",
    "einsum",
    "epilogue",
    "fp8_bmm",
    "fp8_einsum",
    "fp8_fp4_gemm_nn",
    "fp4_gemm_nt",
    "k_grouped_fp4_gemm_nt_contiguous",
    "fp8_fp4_gemm_nt",
    "fp8_fp4_gemm_tn",
    "fp8_fp4_gemm_tt",
    "fp8_fp4_mqa_logits",
    "fp8_fp4_paged_mqa_logits",
    "fp8_gemm_nn",
    "fp8_gemm_nt",
    "fp8_gemm_nt_skip_head_mid",
    "fp8_gemm_tn",
    "fp8_gemm_tt",
    "fp8_m_grouped_gemm_nt_masked",
    "fp8_mqa_logits",
    "fp8_paged_mqa_logits",
    "get_deterministic_algorithms",
    "get_num_sms",
    "get_paged_mqa_logits_metadata",
    "get_mqa_logits_metadata",
    "bf16_mega_gate",
    "get_bf16_mega_gate_config",
    "mega_mhc",
    "get_sparse_mqa_logits_metadata",
    "get_paged_sparse_mqa_logits_metadata",
    "fp8_fp4_sparse_mqa_logits",
    "fp8_fp4_paged_sparse_mqa_logits",
    "get_pdl",
    "get_tc_util",
    "k_grouped_bf16_gemm_tn_contiguous",
    "k_grouped_fp8_gemm_nt_contiguous",
    "k_grouped_fp8_gemm_tn_contiguous",
    "legacy",
    "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_bf16_gemm_nt_masked",
    "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_fp4_gemm_nt_contiguous",
    "m_grouped_fp4_gemm_nt_masked",
    "m_grouped_fp8_fp4_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked",
    "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "set_block_size_multiple_of",
    "set_ignore_compile_dims",
    "set_num_sms",
    "set_pdl",
    "set_tc_util",
    "testing",
    "tf32_hc_prenorm_gemm",
    "SymmBuffer",
    "bf16_mega_moe",
    "fp8_fp4_mega_moe",
    "get_symm_buffer_for_mega_moe",
    "SM90SymmBuffer",
    "fp8_mega_moe",
    "get_symm_buffer_for_sm90_mega_moe",
    "transform_weights_for_mega_moe_sm90",
    "get_block_m_for_mega_moe",
    "get_token_alignment_for_mega_moe",
    "transform_weights_for_mega_moe",
    "transform_sf_into_required_layout",
    "use_deterministic_algorithms",
    "utils",
]
