"""The topk_select family: DeepSelect's top-k for the sparse-attention indexer and the sampler."""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import FROM_SCHEMA, schema_defaults

_topk_select = torch.ops.ascend_moe.topk_select.default


@schema_defaults
def topk_select(
    input: torch.Tensor,
    topk: int,
    end: torch.Tensor | None = None,
    output_idx_offset: torch.Tensor | None = None,
    *,
    sorted: bool = FROM_SCHEMA,
    indices_dtype: torch.dtype | None = None,
    idx_oob_fill_value: int = FROM_SCHEMA,
    value_oob_fill_value: float | None = None,
    abort_when_nan_found: bool = FROM_SCHEMA,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values [b, topk], indices [b, topk])``: the ``topk`` largest elements of each row ``input[i, :end[i]]``.

    ``input [b, V]`` BF16/FP16/FP32/FP64 (any strides); ``end [b]`` int32 (default V) bounds each row;
    ``output_idx_offset [b]`` int32 is added to every selected index. Output order: ascending column (what
    DeepSelect's ``sorted_index`` asks for), or value descending with ``sorted=True``; equal values rank +0.0
    above -0.0, then the lower column (DeepSelect leaves ties arbitrary: any valid set). Rows with fewer than
    ``topk`` elements put them first and fill the rest with ``idx_oob_fill_value`` (not offset) and
    ``value_oob_fill_value`` (None: -inf, rounded to the input's dtype). A row holding NaN in its range raises
    ``ValueError`` with ``abort_when_nan_found``, else gets 0x3F3F3F3F indices and NaN values. Indices are
    int64 unless ``indices_dtype=torch.int32``. Differentiable in ``input``.

    >>> values, indices = topk_select(torch.tensor([[1.0, 5.0, 3.0, 4.0]]), 2)
    >>> values.tolist(), indices.tolist()
    ([[5.0, 4.0]], [[1, 3]])
    """
    return _topk_select(
        input,
        topk,
        end,
        output_idx_offset,
        sorted,
        indices_dtype,
        idx_oob_fill_value,
        value_oob_fill_value,
        abort_when_nan_found,
    )
