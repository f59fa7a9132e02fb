"""DeepGEMM's ``tf32_hc_prenorm_gemm`` (specs/deepgemm_api.md §9) over ``ascend_moe::hc_prenorm_gemm``.

The kernel limits (``N % 8 == 0``, ``N <= 128`` on SM100 / 32 on SM90 / 64 on Ascend) come from tile sizes;
the op has none, so they are not enforced here. ``K % 64 == 0`` is (it defines the splits).

On CPU tensors the product is the plain FP32 one, not the op's TF32-rounded b: DeepGEMM's kernel runs on TF32 tensor
cores and its test compares it with ``a.float() @ b.T`` under ``torch.backends.cuda.matmul.allow_tf32``, i.e. with
torch's GEMM at the device's TF32 precision; torch's CPU GEMM has no TF32, so there the same call is the FP32
product (and DeepGEMM's test's 1e-8 bound holds: TF32's rounding alone is ~2e-8 from it).
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck
from torch_ascend_moe.backends.portable import hc_prenorm as portable_hc_prenorm
from torch_ascend_moe.ops.hc_prenorm import hc_prenorm_gemm


def tf32_hc_prenorm_gemm(a, b, d, sqr_sum, num_splits=None) -> None:
    """``d = a.float() @ tf32(b)^T`` and ``sqr_sum = a.float().square().sum(-1)`` (per split with ``num_splits``)."""
    api = "deep_gemm.tf32_hc_prenorm_gemm"
    lead = [] if num_splits is None else [num_splits]
    for name, t, shape in (("d", d, [*lead, a.shape[0], b.shape[0]]), ("sqr_sum", sqr_sum, [*lead, a.shape[0]])):
        ck.check_arg(t.dtype == torch.float32, api, name, "dtype", "torch.float32", t.dtype)
        ck.check_arg(list(t.shape) == shape, api, name, "shape", ck.shape_str(shape), lambda t=t: ck.shape_str(t.shape))
    ck.check_arg(sqr_sum.is_contiguous(), api, "sqr_sum", "layout", "contiguous", "a strided view")
    if a.shape[0] == 0:
        return
    if a.device.type == "cpu":
        out_d, out_sqr = portable_hc_prenorm.products(a, b, num_splits, tf32=False)
    else:
        out_d, out_sqr = hc_prenorm_gemm(a, b, num_splits=num_splits)
    d.copy_(out_d)
    sqr_sum.copy_(out_sqr)
