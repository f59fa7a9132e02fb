"""Device-generic ``topk_select`` with torch ops (CUDA, Ascend and any other device; the CPU runs the C++ kernel).

The rank of an element is its value's order-preserving integer key (the C++ kernel's: +0.0 above -0.0), ties
to the lower column. For 16- and 32-bit inputs the key and the column pack into one int64 (key above, the
column's complement below: every packed value is distinct), so one ``torch.topk`` selects exactly what the C++
kernel selects; FP64 keys take the whole int64, so those rows are ranked by a stable descending sort instead.
"""

from __future__ import annotations

import torch

from torch_ascend_moe._registry import portable_kernel
from torch_ascend_moe.checks import topk_select as checks
from torch_ascend_moe.distributed import capture
from torch_ascend_moe.routing_math import stable_topk

_SIGNED = {2: torch.int16, 4: torch.int32, 8: torch.int64}
_COLUMN_BITS = 31  # columns below 2^31 (V is an int32 size)

# DeepSelect's marker of a row that held NaN (abort_when_nan_found=False): every index of the row.
NAN_MARKER = 0x3F3F3F3F


def order_key(x: torch.Tensor) -> torch.Tensor:
    """int64 keys whose signed order is ``x``'s float order (-0.0 just below +0.0; NaN outside ±inf): the bits as a
    signed integer with the magnitude bits of negative values flipped."""
    width = x.element_size() * 8
    bits = x.view(_SIGNED[x.element_size()])
    magnitude = torch.iinfo(bits.dtype).max
    return (bits ^ ((bits >> (width - 1)) & magnitude)).long()


def selected_columns(input: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """The columns of the ``k`` (<= V) best valid elements of each row, best first (key descending, ties to the
    lower column); invalid columns rank below every valid one."""
    key = order_key(input)
    if input.element_size() < 8:
        offset = 2 ** (input.element_size() * 8 - 1)  # keys as non-negative integers, so the packing is ordered
        low = 2**_COLUMN_BITS - 1
        cols = torch.arange(input.shape[1], device=input.device)
        packed = torch.where(valid, ((key + offset) << _COLUMN_BITS) | (low - cols), -1)
        return low - (packed.topk(k, dim=1).values & low)
    ranked = torch.where(valid, key, torch.iinfo(torch.int64).min)
    return stable_topk(ranked, k)


def row_lengths(input: torch.Tensor, end: torch.Tensor | None) -> torch.Tensor:
    """Each row's valid length (int64), ``end`` checked where its values may be read on the host."""
    b, V = input.shape
    if end is None:
        return torch.full((b,), V, device=input.device)
    if capture.host_readable(end):
        checks.check_end_values(end, V)
    return end.long()


def nan_rows(input: torch.Tensor, n: torch.Tensor, abort_when_nan_found: bool) -> torch.Tensor:
    """``[b, 1]``: whether a row holds NaN in its range; with ``abort_when_nan_found`` the first one raises (where
    the values may be read on the host)."""
    nan = input.isnan() & (torch.arange(input.shape[1], device=input.device) < n[:, None])
    if abort_when_nan_found and capture.host_readable(input):
        hit = nan.nonzero()
        if hit.numel():
            checks.nan_error(*hit[0].tolist())
    return nan.any(1, keepdim=True)


def finish(args, cols, n, nan_row, idx_dtype):
    """The op's outputs from the selected columns ``cols [b, min(topk, V)]`` (a row's first ``min(n, topk)`` in
    their output order; the rest ignored): values gathered, offsets added (an int32 wrap raises where the values
    may be read on the host), fills, NaN rows, padding up to ``topk`` columns."""
    input, topk, output_idx_offset = args.input, args.topk, args.output_idx_offset
    b, V = input.shape
    k = cols.shape[1]
    # A NaN row's columns may be anything (a device kernel's marker): never read.
    keep = (torch.arange(k, device=input.device) < torch.clamp(n, max=topk)[:, None]) & ~nan_row
    cols = torch.where(keep, cols, 0)
    values = input.gather(1, cols)
    indices = cols if output_idx_offset is None else cols + output_idx_offset.long()[:, None]
    if idx_dtype == torch.int32 and output_idx_offset is not None and capture.host_readable(indices):
        wraps = keep & ((indices < checks.INT32[0]) | (indices > checks.INT32[1]))
        hit = wraps.nonzero()
        if hit.numel():
            row, slot = hit[0].tolist()
            checks.offset_error(int(cols[row, slot]), int(output_idx_offset[row]), row)
    # The fill rounded to the input's dtype (a value beyond its range becomes ±inf, as a C++ cast does).
    fill = torch.tensor(
        float("-inf") if args.value_oob_fill_value is None else args.value_oob_fill_value,
        dtype=torch.float64,
        device=input.device,
    ).to(input.dtype)
    nan_value = torch.tensor(float("nan"), dtype=input.dtype, device=input.device)
    if k < topk:  # V < topk: every row is short
        values = torch.nn.functional.pad(values, (0, topk - k))
        indices = torch.nn.functional.pad(indices, (0, topk - k))
        keep = torch.nn.functional.pad(keep, (0, topk - k), value=False)
    values = torch.where(nan_row, nan_value, torch.where(keep, values, fill))
    indices = torch.where(nan_row, NAN_MARKER, torch.where(keep, indices, args.idx_oob_fill_value)).to(idx_dtype)
    return values.contiguous(), indices.contiguous()


@portable_kernel
def topk_select(args):
    idx_dtype = checks.topk_select_signature(args)
    x, topk = args.input, args.topk
    V = x.shape[1]
    n = row_lengths(x, args.end)
    nan_row = nan_rows(x, n, args.abort_when_nan_found)
    k = min(topk, V)
    cols = selected_columns(x, torch.arange(V, device=x.device) < n[:, None], k)
    if not args.sorted:  # ascending columns, the kept ones first
        keep = torch.arange(k, device=x.device) < torch.clamp(n, max=topk)[:, None]
        cols = torch.sort(torch.where(keep, cols, V), dim=1).values
    return finish(args, cols, n, nan_row, idx_dtype)
