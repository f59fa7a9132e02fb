"""Ascend adapter of ``fp8_gemm`` (torch_npu 2.13): DeepGEMM's 1x128 x 128x128 FP32 block recipe through
``npu_quant_matmul``'s "G-B" mode.

Mapping: ``npu_quant_matmul(a, b.t(), sfb.t(), pertoken_scale=sfa, output_dtype=bf16, group_sizes=[1, 128,
128])``: x1 = ``a [M, K]`` FP8 with per-token-group FP32 scales ``[M, K/128]``, x2 = ``b.t() [K, N]`` (a
transposed view, the op's "transposed weight") with FP32 block scales ``[K/128, N/128]``; the product is
accumulated in FP32 and rounded once to BF16, as ours. Where the reading comes from: the wheel's docs describe
only the INT8 / INT4 modes of ``npu_quant_matmul``; the FP8 inputs, ``group_sizes`` and the G-B scale shapes are
what its meta checks (``quant_matmul_group_sizes_check``), and torchao-npu uses this mode for block FP8 on
Ascend 950. Our FP32 sum over all of K and the op's per-128 block partial sums differ in summation order only
(not bitwise; the harness's calc_diff bound), so this adapter is checked against our reading, not Ascend's
kernel. Only on Ascend 950 (SoC >= 260): A2/A3 have no FP8.

Stays portable, and why: ``c`` given or ``alpha != 1`` (the op has a bias vector, no accumulator and no alpha;
folding alpha into a scale adds a rounding), FP32 output (not among the op's documented output dtypes), UE8M0
``float8_e8m0fnu`` scales and the 1x128 x 1x128 / FP4 recipes (MX modes with E8M0 scale layouts the docs do not
describe), K or N above 65535 (its limit), empty operands. ``fp8_bmm`` / ``fp8_einsum``: the batched G-B scale
layout is not described anywhere in the wheel (the meta indexes scales from the last two dims only), so they keep
the portable kernel.

GE graph mode (TorchAir): the converter builds the same call (``b`` and ``sfb`` transposed by Transpose nodes, as
TorchAir converts ``.t()``) through torch_npu's converter of ``npu_quant_matmul``, which emits
``QuantBatchMatmulV4`` with the packed ``group_size`` on Ascend 950; any other call has no graph.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import npu_ge_converter
from torch_ascend_moe.backends.chain import first_refusal, kernel, stays_portable
from torch_ascend_moe.backends.npu import ge_graph, has_op
from torch_ascend_moe.backends.npu.quant import ASCEND950, soc_version
from torch_ascend_moe.checks.fp8_gemm import fp8_gemm_signature

GROUP_SIZES = [1, 128, 128]  # npu_quant_matmul's [M, N, K] groups of the "G-B" mode
MAX_INNER = 65535  # the op's limit on the last dims of x1 and x2


def block_recipe_refusal(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, dtype) -> str | None:
    """Why ``npu_quant_matmul``'s G-B mode does not compute this ``fp8_gemm`` call, or None when it does."""
    (m, k), n = a.shape, b.shape[0]
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        return "not FP8 x FP8"
    if sfa.dtype != torch.float32 or sfb.dtype != torch.float32:
        return "UE8M0 scales (the G-B mode takes FP32 ones)"
    if list(recipe_a) != [1, 128] or list(recipe_b) != [128, 128]:
        return "not the 1x128 x 128x128 recipe"
    if not (0 < m and 0 < n <= MAX_INNER and 0 < k <= MAX_INNER):
        return f"empty operands, or N or K above {MAX_INNER}"
    if c is not None or alpha != 1.0 or dtype != torch.bfloat16:
        return "c, alpha or an FP32 output (the op has a bias vector, no accumulator, no alpha; BF16 out)"
    if soc_version() < ASCEND950:
        return "not an Ascend 950 (no FP8 before it)"
    return None


def block_recipe(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, dtype) -> bool:
    """Whether ``npu_quant_matmul``'s G-B mode computes this ``fp8_gemm`` call."""
    return block_recipe_refusal(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, dtype) is None


def _takes(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    _, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    return first_refusal(block_recipe_refusal(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, dtype))


@kernel(device="npu", library="torch_npu", calls="npu_quant_matmul", available=has_op("npu_quant_matmul"), takes=_takes)
def fp8_gemm(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype):
    _, dtype = fp8_gemm_signature(a, sfa, b, sfb, c, recipe_a, recipe_b, out_dtype)
    return torch.ops.npu.npu_quant_matmul(
        a, b.t(), sfb.t().contiguous(), pertoken_scale=sfa.contiguous(), output_dtype=dtype, group_sizes=GROUP_SIZES
    ).contiguous()


@npu_ge_converter("fp8_gemm", ir="QuantBatchMatmulV4")
def fp8_gemm_ge(a, sfa, b, sfb, c, recipe_a, recipe_b, alpha, out_dtype, meta_outputs=None):
    dtype = ge_graph.torch_dtype(meta_outputs)
    if not block_recipe(a.meta, sfa.meta, b.meta, sfb.meta, c, recipe_a, recipe_b, alpha, dtype):
        raise ge_graph.unsupported(
            "fp8_gemm",
            "only the 1x128 x 128x128 FP32-scale recipe to BF16 on Ascend 950, "
            "without c or alpha, maps to QuantBatchMatmulV4",
        )
    ge = ge_graph.api()
    b_t = ge_graph.with_meta(ge.Transpose(b, ge_graph.i64([1, 0])), b.meta.t())
    sfb_t = ge_graph.with_meta(ge.Transpose(sfb, ge_graph.i64([1, 0])), sfb.meta.t())
    return ge_graph.npu_converter("npu_quant_matmul")(
        a,
        b_t,
        sfb_t,
        pertoken_scale=sfa,
        output_dtype=15,
        group_sizes=GROUP_SIZES,  # 15: bfloat16's ScalarType
    )


stays_portable(
    "fp8_bmm",
    "fp8_einsum",
    device="npu",
    why="npu_quant_matmul has no batched form of the 1x128 x 128x128 block-scale recipe",
)
