"""The topk_select family's argument checks. Twin: ``csrc/ops/topk_select_checks.h`` (the same checks in the same
order, the same words; tests/test_validation_twins.py compares them)."""

from __future__ import annotations

import torch

from torch_ascend_moe import checks as ck

OP = "ascend_moe::topk_select"
DTYPES_TEXT = "torch.bfloat16, torch.float16, torch.float32 or torch.float64"
INT32 = (-(2**31), 2**31 - 1)


def check_index_vector(name: str, t, input) -> None:
    if t is None:
        return
    ck.check_rank(OP, name, t, 1, "[b] (one per row)")
    ck.check_arg(t.dtype == torch.int32, OP, name, "dtype", "torch.int32", t.dtype)
    ck.check_arg(t.device == input.device, OP, name, "device", lambda: f"{input.device} (same as 'input')", t.device)
    ck.check_dim_size(OP, name, t, 0, "b", input.shape[0], "input.size(0)")


def topk_select_signature(args) -> torch.dtype:
    """Checks the arguments (``args``: the op's arguments by name); returns the indices' dtype."""
    input, topk, end, output_idx_offset = args.input, args.topk, args.end, args.output_idx_offset
    indices_dtype, idx_oob_fill_value = args.indices_dtype, args.idx_oob_fill_value
    ck.check_rank(OP, "input", input, 2, "[b, V]")
    ck.check_arg(input.dtype in ck.GEMM_DTYPES, OP, "input", "dtype", DTYPES_TEXT, input.dtype)
    ck.check_int_arg(OP, "topk", topk, 1)
    check_index_vector("end", end, input)
    check_index_vector("output_idx_offset", output_idx_offset, input)
    idx_dtype = torch.int64 if indices_dtype is None else indices_dtype
    ck.check_arg(
        idx_dtype in (torch.int32, torch.int64),
        OP,
        "indices_dtype",
        "value",
        "None, torch.int32 or torch.int64",
        idx_dtype,
    )
    ck.check_arg(
        INT32[0] <= idx_oob_fill_value <= INT32[1],
        OP,
        "idx_oob_fill_value",
        "value",
        "a value in [-2147483648, 2147483647] (DeepSelect's int32 fill)",
        idx_oob_fill_value,
    )
    return idx_dtype


def check_end_values(end, columns: int) -> None:
    """``0 <= end[i] <= V`` (a kernel's check of values: fakes cannot see them)."""
    for i, e in enumerate(end.tolist()):
        ck.check_arg(
            0 <= e <= columns, OP, "end", "values", f"0 <= end[i] <= V={columns} (input.size(1))", f"end[{i}]={e}"
        )


def nan_error(row: int, col: int) -> None:
    ck.check_arg(
        False,
        OP,
        "input",
        "values",
        "no NaN in input[i, :end[i]] (abort_when_nan_found=True)",
        f"NaN at input[{row}, {col}]",
    )


def offset_error(index: int, offset: int, row: int) -> None:
    ck.check_arg(
        False,
        OP,
        "output_idx_offset",
        "values",
        "index + output_idx_offset[i] within torch.int32",
        f"{index} + {offset} in row {row}",
    )
