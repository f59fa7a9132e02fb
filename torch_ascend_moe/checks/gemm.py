"""The gemm family's argument checks (``bf16_gemm``, ``bf16_bmm``, ``bf16_einsum``). Twin:
``csrc/ops/gemm_checks.h`` (the same checks in the same order, the same words; tests/test_validation_twins.py
compares them).

Each ``*_signature`` function validates a call and returns its output shape and dtype.
"""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

GEMM = "ascend_moe::bf16_gemm"
BMM = "ascend_moe::bf16_bmm"
EINSUM = "ascend_moe::bf16_einsum"

EQUATIONS = ("bmk,bnk->mn", "bhr,hdr->bhd", "bhd,hdr->bhr", "bhd,bhr->hdr")


def gemm_signature(a, b, c, out_dtype) -> tuple[list, torch.dtype]:
    ck.check_rank(GEMM, "a", a, 2, "[M, K]")
    ck.check_rank(GEMM, "b", b, 2, "[N, K]")
    ck.check_operand_dtypes(GEMM, a, b)
    ck.check_same_device(GEMM, "b", b, a)
    ck.check_dim_size(GEMM, "b", b, 1, "K", a.shape[1], "a.size(1)")
    dtype = ck.resolve_out_dtype(GEMM, a, c, out_dtype)
    shape = [a.shape[0], b.shape[0]]
    ck.check_accumulator(GEMM, c, a, shape)
    return shape, dtype


def bmm_signature(a, b, c, out_dtype) -> tuple[list, torch.dtype]:
    ck.check_rank(BMM, "a", a, 3, "[B, M, K]")
    ck.check_rank(BMM, "b", b, 3, "[B, N, K]")
    ck.check_operand_dtypes(BMM, a, b)
    ck.check_same_device(BMM, "b", b, a)
    ck.check_dim_size(BMM, "b", b, 0, "batch", a.shape[0], "a.size(0)")
    ck.check_dim_size(BMM, "b", b, 2, "K", a.shape[2], "a.size(2)")
    dtype = ck.resolve_out_dtype(BMM, a, c, out_dtype)
    shape = [a.shape[0], a.shape[1], b.shape[1]]
    ck.check_accumulator(BMM, c, a, shape)
    return shape, dtype


def einsum_signature(equation, a, b, c, out_dtype) -> tuple[list, torch.dtype]:
    """Checks ranks and that every subscript letter has one size across a and b."""
    expected = "one of " + ", ".join(f"'{e}'" for e in EQUATIONS)
    ck.check_arg(equation in EQUATIONS, EINSUM, "equation", "value", expected, f"'{equation}'")
    sa, sb, so = equation[0:3], equation[4:7], equation[9:]
    ck.check_rank(EINSUM, "a", a, 3, f"[{sa}]")
    ck.check_rank(EINSUM, "b", b, 3, f"[{sb}]")
    ck.check_operand_dtypes(EINSUM, a, b)
    ck.check_same_device(EINSUM, "b", b, a)
    for j, label in enumerate(sb):
        i = sa.find(label)
        if i >= 0:
            ck.check_dim_size(EINSUM, "b", b, j, f"'{label}'", a.shape[i], f"a.size({i})")
    dtype = ck.resolve_out_dtype(EINSUM, a, c, out_dtype)
    shape = [a.shape[sa.index(x)] if x in sa else b.shape[sb.index(x)] for x in so]
    ck.check_accumulator(EINSUM, c, a, shape)
    return shape, dtype
