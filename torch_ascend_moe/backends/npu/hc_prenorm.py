"""The hc_prenorm family on Ascend: ``hc_prenorm_gemm`` stays on its portable kernel (an FP32 matmul + a
square sum, ACLNN on an NPU); no adapter is registered. Why ``npu_mhc_pre`` does not map exactly:

* What agrees: ``npu_mhc_pre``'s ``h_mix`` is "x times phi" (docs), ``[T, n^2 + 2n]`` FP32 for
  ``x [T, n, D]`` BF16/FP16 and ``phi [n^2 + 2n, n*D]`` FP32: our ``d`` for ``a = x.reshape(T, n*D)``, ``b = phi``
  (the layout ``mhc_pre_operands`` builds; ``num_splits`` None). Its shape and dtype are checked against our
  op's fake; its values (in our CPU reading) against ``d`` within TF32 rounding.
* Precision: ours reads ``b`` rounded to TF32 (DeepGEMM's tensor-core contract); ``inner_precise=0`` is full
  FP32 and ``1`` is HF32 (not TF32): neither is bitwise ours.
* ``sqr_sum`` is not an output: only ``inv_rms = rsqrt(sqr_sum / (n*D) + norm_eps)`` (with ``gamma`` None),
  from which ``sqr_sum`` comes back only approximately (and not at all for ``norm_eps`` dominating).
* Split-K partials (``num_splits``) have no counterpart; ``b`` must have ``n^2 + 2n`` rows for some ``n``
  (n = 4, 6, 8 in the docs); ``alpha``/``bias`` must be supplied and the op computes the whole mHC pre block
  (sigmoids, ``h_in``): wasted work for the GEMM alone.
* Hardware: the docs list only Ascend 950 for ``npu_mhc_pre``.

The natural mapping is a level up: the DeepSeek-V4 mHC "pre" block (prenorm GEMM -> rsqrt scaling -> bias,
alpha, sigmoid -> ``h_in`` mix) as a whole is ``npu_mhc_pre`` (and ``npu_mhc_post`` / ``npu_mhc_sinkhorn``
after it): a compiler pass matching that subgraph, not an adapter of ``hc_prenorm_gemm``.
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe.backends.chain import stays_portable


def hc_streams(num_rows_b: int) -> int | None:
    """``n`` with ``n^2 + 2n == num_rows_b`` (``b``'s rows, ``npu_mhc_pre``'s ``mat_k``), else None."""
    n = math.isqrt(num_rows_b + 1) - 1
    return n if n > 0 and n * n + 2 * n == num_rows_b else None


def mhc_pre_operands(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x [M, n, K/n], phi = b)``: the ``npu_mhc_pre`` operands whose ``h_mix`` is ``hc_prenorm_gemm(a, b)``'s
    ``d`` (up to TF32 rounding of ``b``); raises when ``b``'s rows are not ``n^2 + 2n`` or ``n`` divides no ``K``."""
    n = hc_streams(b.shape[0])
    if n is None or a.shape[1] % n:
        raise ValueError(
            f"mhc_pre_operands: b has {b.shape[0]} rows and a {a.shape[1]} columns: npu_mhc_pre needs n^2 + 2n "
            "rows with n dividing the columns"
        )
    return a.view(a.shape[0], n, a.shape[1] // n), b


__all__ = ["hc_streams", "mhc_pre_operands"]

stays_portable(
    "hc_prenorm_gemm",
    device="npu",
    why=(
        "npu_mhc_pre fuses a different subgraph with its own rounding points: an FP32 matmul + square sum on "
        "ACLNN instead"
    ),
)
