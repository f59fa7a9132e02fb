"""DeepSelect-compatible API over ``torch.ops.ascend_moe.topk_select``: code written for ``import deep_select`` runs
with ``import torch_ascend_moe.deep_select as deep_select`` (specs/tilekernels_deepselect.md §11).

- ``topk(input, topk, sorted=False, begin=None, end=None, indices_type=torch.int64, sorted_index=False, hint=None,
  output_idx=None, output_idx_offset=None, idx_oob_fill_value=2147483647, value_oob_fill_value=-inf,
  return_value=True, abort_when_nan_found=True)`` -> ``(values | None, indices)``, upstream's checks and output
  layout (rows padded to ``get_stride_requirement()[1]`` bytes; a given ``output_idx`` is filled and returned).
- ``get_stride_requirement()`` -> ``(1024, 32)``: the CUDA build's (input, output) row-stride alignment in bytes.
  The layout upstream's host code demands is checked here as it is there (``RuntimeError``, upstream's words): the
  input's last dimension contiguous, its row stride a multiple of 1024 bytes (with two rows or more), its data
  pointer 32-byte aligned and its allocation covering the last row rounded up to 128 bytes (allocate padded rows,
  then slice, as DeepSelect's tests do); a given ``output_idx``'s row stride a multiple of 32 bytes and its pointer
  32-byte aligned. Addresses are not checked while ``torch.compile`` traces. The op under it
  (``torch.ops.ascend_moe.topk_select``) reads any strides.

Semantics are upstream's: any valid top-k set (ours: ties to +0.0 over -0.0, then the lower column), ascending
indices unless ``sorted`` (which satisfies ``sorted_index``), short rows' valid elements first then the fills
(not offset). A row holding NaN: ``abort_when_nan_found=True`` raises ``ValueError`` (upstream traps the device);
False fills the whole index row with 0x3F3F3F3F (Ascend's form; CUDA's sets ``[row, 0]``) and its values with NaN.
The older ``do_check_nan=False`` is accepted and reads as ``abort_when_nan_found=False`` (rows are still checked).
Inputs beyond upstream's limits (FP16/FP64, k > 4096, BF16 with ``sorted``) are rejected here as upstream does;
the op itself computes them.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.ops.topk_select import topk_select

__version__ = "1.0.0"

MAX_TOPK = 4096
MAX_VOCAB_SIZE = (1 << 23) - 1  # upstream's CUDA kernels: vocab_size < 2^23
_STRIDE_REQUIREMENT = (1024, 32)


class DeepSelectError(ValueError, RuntimeError):
    """An argument upstream rejects: its Python interface raises ``ValueError``, its C++ checks ``RuntimeError``;
    this is both, so callers written against either catch it."""


def get_stride_requirement() -> tuple[int, int]:
    """``(input, output)`` row-stride alignment in bytes (the CUDA build's values)."""
    return _STRIDE_REQUIREMENT


def _require(cond: bool, text: str) -> None:
    if not cond:
        raise DeepSelectError(f"deep_select.topk: {text}")


def _aligned_empty(rows: int, cols: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``[rows, cols]`` whose row stride is a multiple of the output requirement (upstream's allocation)."""
    per_row = max(1, _STRIDE_REQUIREMENT[1] // dtype.itemsize)
    return torch.empty(rows, -(-cols // per_row) * per_row, dtype=dtype, device=device)[:, :cols]


def _check_vector(name: str, t: torch.Tensor | None, rows: int) -> None:
    if t is None:
        return
    _require(t.dtype == torch.int32, f"`{name}` must be torch.int32, got {t.dtype}")
    _require(t.dim() == 1 and t.shape[0] == rows, f"`{name}` must have shape ({rows},), got {tuple(t.shape)}")


def _check_rows(name: str, t: torch.Tensor, requirement: int) -> None:
    """Upstream's row-stride and pointer checks of a ``[b, n]`` tensor its kernels read or write by rows (TMA)."""
    stride, size = t.stride(0), t.element_size()
    _require(
        t.shape[0] <= 1 or stride * size % requirement == 0,  # one row: no other row to reach (upstream checks anyway)
        f"{name}.stride(0) (currently {stride} numbers) must be a multiple of {requirement} Bytes "
        f"({requirement // size} numbers)",
    )
    if _addressed(t):
        _require(t.data_ptr() % 32 == 0, f"{name}.data_ptr() must be 32-byte aligned")


def _addressed(t: torch.Tensor) -> bool:
    """Whether ``t`` has real memory to check: not a meta tensor, and not traced by ``torch.compile`` (fake tensors
    have no addresses; a compiled caller's checks are the ones on strides and shapes)."""
    return t.device.type != "meta" and not torch.compiler.is_compiling()


def _check_input_layout(x: torch.Tensor) -> None:
    rows, columns = x.shape
    _require(columns <= 1 or x.stride(1) == 1, f"input's last dimension must be contiguous, got strides {x.stride()}")
    _check_rows("input", x, _STRIDE_REQUIREMENT[0])
    if rows == 0 or columns == 0 or not _addressed(x):
        return
    # The CUDA kernels' TMA descriptor rounds each row up to 128 bytes, the last row's padding included.
    size = x.element_size()
    last_row = (x.storage_offset() + (rows - 1) * x.stride(0)) * size
    padded_row = -(-columns * size // 128) * 128
    storage = x.untyped_storage().nbytes()
    _require(
        last_row <= storage and padded_row <= storage - last_row,
        "input backing storage must include the final row padded to a multiple of 128 bytes",
    )


def _check_output_dtype(output_idx: torch.Tensor | None, indices_type: torch.dtype) -> None:
    """Upstream's interface checks this before anything reaches its backend (a ``TypeError``)."""
    if output_idx is not None and output_idx.dtype != indices_type:
        raise TypeError(f"deep_select.topk: output_idx dtype must be {indices_type}, got {output_idx.dtype}")


def _check_output(output_idx: torch.Tensor, rows: int, topk: int) -> None:
    _require(
        tuple(output_idx.shape) == (rows, topk),
        f"output_idx must have shape ({rows}, {topk}), got {tuple(output_idx.shape)}",
    )
    _require(topk == 1 or output_idx.stride(1) == 1, "output_idx's last dimension must be contiguous")
    _check_rows("output_index", output_idx, _STRIDE_REQUIREMENT[1])
    _require(rows <= 1 or output_idx.stride(0) >= topk, "output_index rows must not overlap")


def topk(
    input: torch.Tensor,
    topk: int,
    sorted: bool = False,
    begin: torch.Tensor | None = None,
    end: torch.Tensor | None = None,
    indices_type: torch.dtype = torch.int64,
    sorted_index: bool = False,
    hint: torch.Tensor | None = None,
    output_idx: torch.Tensor | None = None,
    output_idx_offset: torch.Tensor | None = None,
    idx_oob_fill_value: int = 2147483647,
    value_oob_fill_value: float = float("-inf"),
    return_value: bool = True,
    abort_when_nan_found: bool = True,
    do_check_nan: bool = True,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """DeepSelect's ``topk``: ``(values [b, topk] or None, indices [b, topk])`` of ``input [b, vocab_size]``
    (BF16 or FP32); see the module docstring for the semantics.

    As upstream, the input's storage must hold its last row rounded up to 128 bytes (allocate padded rows, then
    slice):

    >>> rows = torch.zeros(1, 32)  # 128-byte FP32 rows
    >>> rows[:, :4] = torch.tensor([0.5, 2.0, -1.0, 3.0])
    >>> values, indices = topk(rows[:, :4], 2, sorted=True)
    >>> values.tolist(), indices.tolist()
    ([[3.0, 2.0]], [[3, 1]])
    """
    _require(isinstance(topk, int) and 0 < topk <= MAX_TOPK, f"topk must be in [1, {MAX_TOPK}], got {topk}")
    _require(begin is None, "`begin` is not supported now")
    _require(hint is None, "`hint` is not supported now")
    _check_output_dtype(output_idx, indices_type)
    _require(
        indices_type in (torch.int32, torch.int64),
        f"indices_type must be torch.int32 or torch.int64, got {indices_type}",
    )
    _require(input.dim() == 2, f"input must be 2-D (b, vocab_size), got shape {tuple(input.shape)}")
    _require(
        input.dtype in (torch.bfloat16, torch.float32), f"input dtype must be bfloat16 or float32, got {input.dtype}"
    )
    _require(input.shape[1] <= MAX_VOCAB_SIZE, f"vocab_size must be < 2^23, got {input.shape[1]}")
    _require(not (sorted and not return_value), "`return_value` must be enabled when `sorted_value` is True")
    _require(not (sorted and sorted_index), "`sorted_value` and `sorted_index` cannot be used at the same time")
    _require(not (sorted and input.dtype == torch.bfloat16), "`sorted_value` is only supported for float32 input")
    _check_input_layout(input)
    rows = input.shape[0]
    _check_vector("end", end, rows)
    _check_vector("output_idx_offset", output_idx_offset, rows)
    if output_idx is not None:
        _check_output(output_idx, rows, topk)
    values, indices = topk_select(
        input,
        topk,
        end,
        output_idx_offset,
        sorted=sorted,
        indices_dtype=indices_type,
        idx_oob_fill_value=idx_oob_fill_value,
        value_oob_fill_value=value_oob_fill_value,
        abort_when_nan_found=abort_when_nan_found and do_check_nan,
    )
    if output_idx is None:
        output_idx = _aligned_empty(rows, topk, indices_type, input.device)
    output_idx.copy_(indices)
    if not return_value:
        return None, output_idx
    out_values = _aligned_empty(rows, topk, input.dtype, input.device)
    out_values.copy_(values)
    return out_values, output_idx
