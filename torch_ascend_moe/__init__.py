"""torch_ascend_moe: DeepSeek's MoE kernels as first-class PyTorch operators (``torch.ops.ascend_moe.*``).

Importing the package registers every op (schemas and CPU kernels from the ``_C`` extension), its fake,
autograd formula and FLOP formula, plus CUDA/NPU kernels where those runtimes are installed. It probes no
device and compiles nothing, so ``torch.export.load`` and AOTInductor packages work right after it.
"""

import torch

from torch_ascend_moe import (  # noqa: F401  (fakes, backward and FLOP formulas)
    _C,  # noqa: F401  (loads the schemas and CPU kernels)
    autograd,
    backends,
    flops,
    meta,
)
from torch_ascend_moe.backends.portable import ep as _ep_kernels  # noqa: E402, F401  (device-generic ep kernels)
from torch_ascend_moe.ops import (
    bf16_bmm,
    bf16_einsum,
    bf16_gemm,
    fp8_bmm,
    fp8_einsum,
    fp8_gemm,
    fp8_linear,
    fp8_quant_gemm,
    hc_prenorm_gemm,
    k_grouped_bf16_gemm,
    k_grouped_fp8_gemm,
    m_grouped_bf16_gemm,
    m_grouped_bf16_gemm_masked,
    m_grouped_fp8_gemm,
    m_grouped_fp8_gemm_masked,
    m_grouped_fp8_linear,
    mega_moe,
    moe_gating_topk,
    moe_permute,
    moe_unpermute,
    mqa_logits,
    mqa_topk,
    paged_mqa_logits,
    paged_mqa_logits_metadata,
)

__version__ = "0.1.0"
NAMESPACE = "ascend_moe"

backends.register_available()

from torch_ascend_moe import _hf_hook  # noqa: E402

# experts_implementation="ascend_moe" whatever the import order with transformers, without importing it here.
_hf_hook.install()

__all__ = [
    "NAMESPACE",
    "bf16_bmm",
    "bf16_einsum",
    "bf16_gemm",
    "fp8_bmm",
    "fp8_einsum",
    "fp8_gemm",
    "fp8_linear",
    "fp8_quant_gemm",
    "hc_prenorm_gemm",
    "mega_moe",
    "k_grouped_bf16_gemm",
    "k_grouped_fp8_gemm",
    "m_grouped_bf16_gemm",
    "m_grouped_bf16_gemm_masked",
    "m_grouped_fp8_gemm",
    "m_grouped_fp8_gemm_masked",
    "m_grouped_fp8_linear",
    "moe_permute",
    "moe_unpermute",
    "moe_gating_topk",
    "mqa_logits",
    "mqa_topk",
    "paged_mqa_logits",
    "paged_mqa_logits_metadata",
    "torch",
]
