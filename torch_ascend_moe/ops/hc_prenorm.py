"""The hc_prenorm family: DeepGEMM's mHC pre-norm GEMM."""

from __future__ import annotations

import torch

_hc_prenorm = torch.ops.ascend_moe.hc_prenorm_gemm.default


def hc_prenorm_gemm(
    a: torch.Tensor, b: torch.Tensor, *, num_splits: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d, sqr_sum)`` with ``d = float(a) @ tf32(b)^T`` (FP32) and ``sqr_sum[m] = sum_k float(a[m, k])^2``.

    ``a[M, K]`` BF16 (the flattened hyper-connection streams, ``K % 64 == 0``), ``b[N, K]`` FP32 (the
    mixing projection, rounded to TF32 as the tensor-core kernel reads it; FP64 inputs are not rounded).
    ``num_splits = S`` returns per-split partials ``d[S, M, N]``, ``sqr_sum[S, M]`` over 64-wide K blocks
    (DeepGEMM's split rule; empty splits are zeros), which the consumer sums.

    >>> d, sqr = hc_prenorm_gemm(torch.randn(3, 128, dtype=torch.bfloat16), torch.randn(24, 128))
    >>> d.shape, sqr.shape
    (torch.Size([3, 24]), torch.Size([3]))
    """
    return _hc_prenorm(a, b, num_splits)
