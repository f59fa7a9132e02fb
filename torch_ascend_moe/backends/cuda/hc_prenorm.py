"""CUDA kernel of the hc_prenorm family: ``hc_prenorm_gemm`` as one launch of ``_hc``'s Triton kernel (the GEMM and
the squares in one pass over ``a``, every split in the same launch, TF32 tensor cores for BF16 ``a``).

Refused (the portable kernel takes them), and why: FP64 operands (gradcheck's path), no rows or no columns, GPUs
before sm80, builds without Triton.
"""

from __future__ import annotations

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.cuda import triton_available, triton_module
from torch_ascend_moe.checks.hc_prenorm import hc_prenorm_signature

_hc = triton_module("_hc")


def _takes(a, b, num_splits):
    hc_prenorm_signature(a, b, num_splits)
    empty = "no rows or no columns: nothing to launch" if a.shape[0] == 0 or b.shape[0] == 0 else None
    return first_refusal(empty, _hc.refusal(a))


@kernel(device="cuda", library="triton", calls="_hc", takes=_takes, available=triton_available)
def hc_prenorm_gemm(a, b, num_splits):
    return _hc.hc_prenorm_gemm(a, b, num_splits)
