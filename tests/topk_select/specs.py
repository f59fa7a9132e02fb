"""Sample inputs, reference, bad inputs and the harness spec of ``topk_select``.

Shapes follow DeepSelect's grid scaled for a CPU: the indexer (BF16, k in the hundreds over a few thousand
positions, per-row ``end``) and the sampler (FP32, sorted, one vocabulary), plus short rows (``end < topk``,
``V < topk``, empty rows), offsets and int32 indices. Non-FP64 samples are rounded to quarters so many values
tie: the kernels' tie rule (equal keys to the lower column, +0.0 above -0.0) is part of what is compared.
The reference ranks with Python floats and ``math.copysign``, not with the kernels' bit keys.
"""

from __future__ import annotations

import math

import torch

from torch_ascend_moe.backends.portable import topk_select as portable
from torch_ascend_moe.testing.harness import BadInput, OpSpec, SampleInput

# (rows, V, topk, end kind, offsets, sorted, int32 indices)
_CASES = [
    (6, 3000, 256, "random", True, False, True),  # indexer
    (4, 4099, 512, None, False, True, False),  # sampler
    (5, 300, 512, None, True, False, False),  # V < topk: every row short
    (7, 64, 16, "short", False, True, True),  # end < topk on some rows, end == 0 on one
    (0, 50, 4, None, False, False, False),
]
_CASES_SMALL = [(3, 40, 6, "random", True, False, False), (2, 7, 9, "short", False, True, True)]


def _end(kind, rows: int, columns: int, g) -> torch.Tensor | None:
    if kind is None:
        return None
    end = torch.randint(0, columns + 1, (rows,), generator=g, dtype=torch.int32)
    if kind == "short" and rows:
        end[0] = 0
        end[1:3] = torch.randint(1, 5, (len(end[1:3]),), generator=g, dtype=torch.int32)
    return end


def samples(device, dtype, requires_grad=False, small=False) -> list[SampleInput]:
    g = torch.Generator().manual_seed(77)
    out = []
    for rows, columns, k, end_kind, offsets, sort, int32 in _CASES_SMALL if small else _CASES:
        x = torch.randn(rows, columns, generator=g)
        if dtype != torch.float64:
            x = (x * 4).round() / 4
            x[:, ::7] = -x[:, ::7].abs() * 0.0  # -0.0 beside +0.0
        x = x.to(dtype).to(device).requires_grad_(requires_grad)
        end = _end(end_kind, rows, columns, g)
        offset = torch.randint(-(2**20), 2**20, (rows,), generator=g, dtype=torch.int32) if offsets else None
        index_dtype = torch.int32 if int32 else None
        args = (x, k, _on(end, device), _on(offset, device), sort, index_dtype, -7, -1e30, True)
        out.append(SampleInput(args, f"b{rows} V{columns} k{k} end={end_kind} offsets={offsets} sorted={sort}"))
    return out


def _on(t, device):
    return None if t is None else t.to(device)


def _rank(v: float, column: int) -> tuple:
    """Sort key of the order the op documents: value descending, +0.0 above -0.0, then the lower column."""
    return (-v, -math.copysign(1.0, v) if v == 0 else 0.0, column)


def reference(
    input, topk, end, output_idx_offset, by_value, indices_dtype, idx_oob_fill_value, value_oob_fill_value, abort
):
    rows, columns = input.shape
    fill = float("-inf") if value_oob_fill_value is None else value_oob_fill_value
    fill = float(torch.tensor(fill, dtype=torch.float64).to(input.dtype))  # rounded to the input's dtype
    values = torch.full((rows, topk), fill, dtype=torch.float64)
    indices = torch.full((rows, topk), idx_oob_fill_value, dtype=indices_dtype or torch.int64)
    for i in range(rows):
        n = columns if end is None else int(end[i])
        row = input[i, :n].detach().double().tolist()
        if any(math.isnan(v) for v in row):
            values[i], indices[i] = float("nan"), 0x3F3F3F3F
            continue
        chosen = [c for _, _, c in sorted(_rank(v, c) for c, v in enumerate(row))][:topk]
        if not by_value:
            chosen.sort()
        offset = 0 if output_idx_offset is None else int(output_idx_offset[i])
        for s, c in enumerate(chosen):
            values[i, s], indices[i, s] = row[c], c + offset
    return values, indices


def bad_inputs(device) -> list[BadInput]:
    x = torch.randn(3, 10)
    end = torch.tensor([10, 4, 0], dtype=torch.int32)
    nan = x.clone()
    nan[1, 6] = float("nan")
    big = torch.tensor([0, 0, 2**31 - 5], dtype=torch.int32)

    def call(**kw):
        args = dict(
            input=x,
            topk=4,
            end=None,
            output_idx_offset=None,
            sorted=False,
            indices_dtype=None,
            idx_oob_fill_value=-1,
            value_oob_fill_value=None,
            abort=True,
        )
        args.update(kw)
        return tuple(args.values())

    return [
        BadInput(call(input=x[0]), r"argument 'input' rank: expected 2-D \[b, V\], got 1-D", "input rank"),
        BadInput(call(input=x.long()), r"argument 'input' dtype: expected torch.bfloat16, torch.float16", "dtype"),
        BadInput(call(topk=0), r"argument 'topk' value: expected a positive integer, got 0", "topk"),
        BadInput(call(end=end.long()), r"argument 'end' dtype: expected torch.int32, got torch.int64", "end dtype"),
        BadInput(call(end=end[:2]), r"argument 'end' size\(0\) \(b\): expected 3 \(input.size\(0\)\), got 2", "end"),
        BadInput(
            call(output_idx_offset=end.view(3, 1)), r"argument 'output_idx_offset' rank: expected 1-D \[b\]", "offsets"
        ),
        BadInput(
            call(indices_dtype=torch.int16),
            r"argument 'indices_dtype' value: expected None, torch.int32 or torch.int64, got torch.int16",
            "indices dtype",
        ),
        BadInput(
            call(indices_dtype=torch.int32, idx_oob_fill_value=2**31),
            r"argument 'idx_oob_fill_value' value: expected a value in \[-2147483648, 2147483647\] "
            r"\(DeepSelect's int32 fill\), got 2147483648",
            "int32 fill",
        ),
        BadInput(
            call(end=torch.tensor([10, 11, 0], dtype=torch.int32)),
            r"argument 'end' values: expected 0 <= end\[i\] <= V=10 \(input.size\(1\)\), got end\[1\]=11",
            "end beyond V",
            data_dependent=True,
        ),
        BadInput(
            call(end=torch.tensor([10, -1, 0], dtype=torch.int32)),
            r"argument 'end' values: expected 0 <= end\[i\] <= V=10 \(input.size\(1\)\), got end\[1\]=-1",
            "negative end",
            data_dependent=True,
        ),
        BadInput(
            call(input=nan),
            r"argument 'input' values: expected no NaN in input\[i, :end\[i\]\] \(abort_when_nan_found=True\), "
            r"got NaN at input\[1, 6\]",
            "NaN",
            data_dependent=True,
        ),
        BadInput(
            call(output_idx_offset=big, indices_dtype=torch.int32, sorted=True, input=torch.arange(30.0).view(3, 10)),
            r"argument 'output_idx_offset' values: expected index \+ output_idx_offset\[i\] within torch.int32, "
            r"got 9 \+ 2147483643 in row 2",
            "int32 wrap",
            data_dependent=True,
        ),
    ]


SPECS = [
    OpSpec(
        "topk_select",
        samples,
        reference,
        bad_inputs,
        portable.topk_select,
        dtypes=(torch.bfloat16, torch.float16, torch.float32),
    )
]
