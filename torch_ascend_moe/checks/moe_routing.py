"""The moe_routing family's argument checks (``moe_permute``, ``moe_unpermute``, ``moe_gating_topk``). Twin:
``csrc/ops/moe_routing_checks.h`` (the same checks in the same order, the same words;
tests/test_validation_twins.py compares them). The permuted buffer has a static capacity, so graphs need no
data-dependent shapes; id and row values are checked by the eager kernels (``check_range``)."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

PERMUTE = "ascend_moe::moe_permute"
UNPERMUTE = "ascend_moe::moe_unpermute"
GATING = "ascend_moe::moe_gating_topk"


def permute_capacity(tokens, topk, experts, alignment):
    """Rows of moe_permute's output: every routed pair plus the most alignment padding E segments can need."""
    return tokens * topk + max(experts - 1, 0) * (alignment - 1)


PERMUTE_ROWS_TEXT = "small enough that the T * k + (num_experts - 1) * (alignment - 1) output rows fit in int32"


def permute_signature(x, topk_idx, num_experts, alignment) -> int:
    op = PERMUTE
    ck.check_rank(op, "x", x, 2, "[T, H]")
    ck.check_arg(x.dtype in ck.GEMM_DTYPES, op, "x", "dtype", ck.GEMM_DTYPES_TEXT, x.dtype)
    ck.check_rank(op, "topk_idx", topk_idx, 2, "[T, k]")
    ck.check_arg(
        topk_idx.dtype in (torch.int32, torch.int64),
        op,
        "topk_idx",
        "dtype",
        "torch.int32 or torch.int64",
        topk_idx.dtype,
    )
    ck.check_arg(
        topk_idx.device == x.device, op, "topk_idx", "device", lambda: f"{x.device} (same as 'x')", topk_idx.device
    )
    ck.check_dim_size(op, "topk_idx", topk_idx, 0, "T", x.shape[0], "x.size(0)")
    ck.check_int_arg(op, "num_experts", num_experts, 1)
    ck.check_int_arg(op, "alignment", alignment, 1)
    capacity = permute_capacity(x.shape[0], topk_idx.shape[1], num_experts, alignment)
    # row_map and offs hold output rows as int32.
    ck.check_arg(capacity <= ck.MAX_INT_ARG, op, "alignment", "value", PERMUTE_ROWS_TEXT, alignment)
    return capacity


def unpermute_signature(y, row_map, topk_weights, bias=None) -> None:
    op = UNPERMUTE
    ck.check_rank(op, "y", y, 2, "[R, H]")
    ck.check_arg(y.dtype in ck.GEMM_DTYPES, op, "y", "dtype", ck.GEMM_DTYPES_TEXT, y.dtype)
    ck.check_rank(op, "row_map", row_map, 2, "[T, k]")
    ck.check_arg(row_map.dtype == torch.int32, op, "row_map", "dtype", "torch.int32", row_map.dtype)
    ck.check_arg(
        row_map.device == y.device, op, "row_map", "device", lambda: f"{y.device} (same as 'y')", row_map.device
    )
    if topk_weights is not None:
        same = topk_weights.dim() == 2 and all(s == r for s, r in zip(topk_weights.shape, row_map.shape))
        ck.check_arg(
            same,
            op,
            "topk_weights",
            "shape",
            lambda: f"{ck.shape_str(row_map.shape)} (row_map's shape)",
            lambda: ck.shape_str(topk_weights.shape),
        )
        ck.check_arg(
            topk_weights.dtype in ck.GEMM_DTYPES, op, "topk_weights", "dtype", ck.GEMM_DTYPES_TEXT, topk_weights.dtype
        )
        ck.check_arg(
            topk_weights.device == y.device,
            op,
            "topk_weights",
            "device",
            lambda: f"{y.device} (same as 'y')",
            topk_weights.device,
        )
    if bias is not None:
        t, h = row_map.shape[0], y.shape[1]
        ck.check_arg(
            bias.dim() == 2 and bias.shape[0] == t and bias.shape[1] == h,
            op,
            "bias",
            "shape",
            lambda: f"{ck.shape_str([t, h])} (row_map.size(0), y.size(1))",
            lambda: ck.shape_str(bias.shape),
        )
        ck.check_arg(bias.dtype in ck.GEMM_DTYPES, op, "bias", "dtype", ck.GEMM_DTYPES_TEXT, bias.dtype)
        ck.check_arg(bias.device == y.device, op, "bias", "device", lambda: f"{y.device} (same as 'y')", bias.device)


def gating_signature(logits, topk, bias, score_func, num_groups, topk_groups) -> torch.dtype:
    """Checks moe_gating_topk's arguments; returns the dtype scores and weights are computed in.

    The gating, for logits ``[T, E]`` (in FP32, FP64 for FP64 logits):
    ``scores = softmax(logits)`` or ``sigmoid(logits)``; ``choice = scores + bias`` (the load-balancing
    ``e_score_correction_bias``, selection only); with ``num_groups > 1`` the E experts form equal groups, a
    group scores its best ``choice`` (the sum of its best two when a bias is given, as DeepSeek-V3) and only
    the best ``topk_groups`` groups stay eligible; ``topk_idx`` = the ``topk`` best eligible experts, best
    first, ties to the lower index (a ``topk`` above the eligible experts takes them all, then the best others, as
    transformers' DeepSeek-V3 router); ``topk_weights = scores[topk_idx]``, divided by their sum (+ 1e-20) when
    ``renormalize``, times ``routed_scaling_factor``."""
    op = GATING
    ck.check_rank(op, "logits", logits, 2, "[T, E]")
    ck.check_arg(logits.dtype in ck.GEMM_DTYPES, op, "logits", "dtype", ck.GEMM_DTYPES_TEXT, logits.dtype)
    e = logits.shape[1]
    ck.check_arg(
        score_func in ("softmax", "sigmoid"), op, "score_func", "value", "'softmax' or 'sigmoid'", f"'{score_func}'"
    )
    ck.check_arg(e > 0, op, "logits", "size(1) (E)", "a positive number of experts", e)
    ck.check_arg(
        num_groups > 0 and e % num_groups == 0,
        op,
        "num_groups",
        "value",
        lambda: f"a positive divisor of the expert count {ck._text(e)}",
        num_groups,
    )
    ck.check_arg(
        0 < topk_groups <= num_groups,
        op,
        "topk_groups",
        "value",
        lambda: f"in [1, num_groups={num_groups}]",
        topk_groups,
    )
    ck.check_arg(0 < topk <= e, op, "topk", "value", lambda: f"in [1, {ck._text(e)}] (the expert count)", topk)
    if bias is not None:
        ck.check_rank(op, "bias", bias, 1, "[E]")
        ck.check_dim_size(op, "bias", bias, 0, "E", e, "logits.size(1)")
        ck.check_arg(
            bias.dtype in (torch.float32, torch.float64),
            op,
            "bias",
            "dtype",
            "torch.float32 or torch.float64",
            bias.dtype,
        )
        ck.check_arg(
            bias.device == logits.device,
            op,
            "bias",
            "device",
            lambda: f"{logits.device} (same as 'logits')",
            bias.device,
        )
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def check_range(op: str, arg: str, values: torch.Tensor, high: int, what: str) -> None:
    """The values of an int32 / int64 ``[T, k]`` id tensor (a kernel's check; fakes cannot see values): each in
    ``[-1, high)``. One host read."""
    if values.numel() == 0:
        return
    bad = (values < -1) | (values >= high)
    if bool(bad.any()):
        i = int(bad.flatten().nonzero()[0])
        t, j = divmod(i, values.shape[1])
        ck.check_arg(
            False,
            op,
            arg,
            "values",
            f"{what} in [-1, {high}) (-1 = not routed)",
            f"{arg}[{t}, {j}] = {int(values.flatten()[i])}",
        )
