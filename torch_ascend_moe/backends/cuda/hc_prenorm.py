"""CUDA kernel of the hc_prenorm family: ``hc_prenorm_gemm`` as one launch of ``_hc``'s Triton kernel (the GEMM and
the squares in one pass over ``a``, every split in the same launch, TF32 tensor cores for BF16 ``a``).

Portable, and why: FP64 operands (gradcheck's path), no rows or no columns, GPUs before sm80, builds without Triton.
"""

from __future__ import annotations

from torch_ascend_moe._registry import cuda_kernel
from torch_ascend_moe.backends.portable import hc_prenorm as portable
from torch_ascend_moe.meta.hc_prenorm import hc_prenorm_signature

try:
    from torch_ascend_moe.backends.cuda import _hc
except ImportError:  # no triton: the portable kernel serves CUDA
    _hc = None


if _hc is not None:

    @cuda_kernel(calls="triton: _hc")
    def hc_prenorm_gemm(a, b, num_splits):
        hc_prenorm_signature(a, b, num_splits)
        if not _hc.usable(a) or a.shape[0] == 0 or b.shape[0] == 0:
            return portable.hc_prenorm_gemm(a, b, num_splits)
        return _hc.hc_prenorm_gemm(a, b, num_splits)
