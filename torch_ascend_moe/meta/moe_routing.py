"""Fakes of the moe_routing family and the validation its Python kernels share (twin of
``csrc/ops/moe_routing_cpu.cpp``). The permuted buffer has a static capacity, so graphs need no
data-dependent shapes; id and row values are checked by the eager kernels."""

from __future__ import annotations

import torch

from torch_ascend_moe import _checks as ck

PERMUTE = "ascend_moe::moe_permute"
UNPERMUTE = "ascend_moe::moe_unpermute"


def permute_capacity(tokens, topk, experts, alignment):
    """Rows of moe_permute's output: every routed pair plus the most alignment padding E segments can need."""
    return tokens * topk + max(experts - 1, 0) * (alignment - 1)


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
    ck.check_arg(num_experts > 0, op, "num_experts", "value", "a positive integer", num_experts)
    ck.check_arg(alignment > 0, op, "alignment", "value", "a positive integer", alignment)
    return permute_capacity(x.shape[0], topk_idx.shape[1], num_experts, alignment)


def unpermute_signature(y, row_map, topk_weights) -> None:
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


@torch.library.register_fake(PERMUTE)
def _permute_fake(x, topk_idx, num_experts, alignment=1):
    capacity = permute_signature(x, topk_idx, num_experts, alignment)
    return (
        x.new_empty([capacity, x.shape[1]]),
        topk_idx.new_empty(topk_idx.shape, dtype=torch.int32),
        topk_idx.new_empty([num_experts], dtype=torch.int32),
    )


@torch.library.register_fake(UNPERMUTE)
def _unpermute_fake(y, row_map, topk_weights=None):
    unpermute_signature(y, row_map, topk_weights)
    return y.new_empty([row_map.shape[0], y.shape[1]])
