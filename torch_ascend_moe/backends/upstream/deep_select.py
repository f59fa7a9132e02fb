"""DeepSelect's own top-k kernels behind ``topk_select`` on CUDA and on Ascend (deepseek-ai/DeepSelect, one package
with a pybind extension per platform: ``deep_select.deep_select_cuda`` and ``deep_select.deep_select_npu``, the same
``topk`` signature; specs/tilekernels_deepselect.md §11). The chain's next kernels otherwise (CUDA and NPU: the
portable kernel, a ``torch.topk`` of packed int64 keys).

What the builds take (their ``csrc/api.cpp`` and ``deep_select/interface.py`` @ 0cae3b1, README @ c799e83), so what
these kernels hand them, every other call refused:

* CUDA: BF16 or FP32 input, ``V < 2**23``; Ascend: BF16 only, ``V < 2**21`` (its ``MAX_VOCAB_SIZE``), int32
  indices only. Both: ``0 < topk <= 4096``, at least one row.
* Input rows whose stride is a multiple of the build's ``get_alignment_requirement()[0]`` bytes (1024 on CUDA), the
  data 32-byte aligned and the allocation covering the last row rounded up to 128 bytes (the CUDA kernels read
  whole TMA tiles): any other input is copied into such rows first (DeepSelect's own README tells callers to).
* Their ties are arbitrary (a valid top-k set, not ours: equal keys to the lower column), so results equal the CPU
  kernel's where no two candidates tie, and are a valid top-k (DeepSelect's own test contract) everywhere.

The kernels ask a build for the selected columns only, in ascending order (``sorted_index=True``: the op's unsorted
order; int32: every column fits), no values, offsets or aborts; values, offsets (with the int32 wrap check), fills and
NaN rows are the portable kernel's own steps, so those semantics are identical on every device. ``sorted=True`` (values
descending, ties to the lower column) ranks the ``topk`` selected columns with the portable kernel's keys (-0.0 below
+0.0): DeepSelect's own value sort is FP32-only and breaks ties its own way.

Verified how: ``tests/upstream/test_deep_select_backend.py`` installs stand-in extensions with each build's
signature, host checks (``api.cpp``'s words) and restrictions, breaking ties at random; not run on a GPU or an NPU.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.portable import topk_select as portable
from torch_ascend_moe.backends.upstream import Library
from torch_ascend_moe.checks import topk_select as checks
from torch_ascend_moe.distributed.capture import has_data

MAX_TOPK = 4096
CUDA_COLUMNS = 2**23 - 1  # api.cpp: vocab_size < MAX_VOCAB_SIZE (2^23) on CUDA
NPU_COLUMNS = 2 * 1024 * 1024 - 1  # and 2M on Ascend
_TILE = 128  # bytes: the CUDA kernels' TMA tile; the allocation must cover the last row rounded up to it

DEEP_SELECT_CUDA = Library("deep_select.deep_select_cuda")
DEEP_SELECT_NPU = Library("deep_select.deep_select_npu")


def _refusal(args, dtypes: tuple, max_columns: int) -> str | None:
    checks.topk_select_signature(args)
    b, V = args.input.shape
    if not has_data(args.input):
        return "fake or meta tensors (the library runs on data; our fake serves tracing)"
    if args.input.dtype not in dtypes:
        return f"{args.input.dtype} input (the build selects from {' or '.join(map(str, dtypes))})"
    if args.topk > MAX_TOPK:
        return f"topk {args.topk} (the build takes at most {MAX_TOPK})"
    if not 0 < V <= max_columns:
        return f"{V} columns (the build takes 1 to {max_columns})"
    return None if b > 0 else "no rows"


def _takes_cuda(args):
    return first_refusal(_refusal(args, (torch.bfloat16, torch.float32), CUDA_COLUMNS))


def _takes_npu(args):
    return first_refusal(_refusal(args, (torch.bfloat16,), NPU_COLUMNS))


def _covers_last_row(x: torch.Tensor) -> bool:
    end = (x.storage_offset() + (x.shape[0] - 1) * x.stride(0)) * x.element_size()
    return end + -(-x.shape[1] * x.element_size() // _TILE) * _TILE <= x.untyped_storage().nbytes()


def aligned_rows(x: torch.Tensor, alignment: int) -> torch.Tensor:
    """``x`` itself when its rows meet the build's layout, else a copy into rows padded to ``alignment`` bytes (a
    fresh allocation: its last row is followed by the padding, so whole tiles stay inside it)."""
    per_row = max(1, alignment // x.element_size())
    if x.stride(1) == 1 and x.stride(0) % per_row == 0 and x.data_ptr() % 32 == 0 and _covers_last_row(x):
        return x
    padded = x.new_empty(x.shape[0], -(-x.shape[1] // per_row) * per_row)
    return padded[:, : x.shape[1]].copy_(x)


def _select(library: Library, args):
    """The op through one build: its columns, then the portable kernel's own finishing steps."""
    idx_dtype = checks.topk_select_signature(args)
    x, topk, end = args.input, args.topk, args.end
    build = library.module()
    n = portable.row_lengths(x, end)
    nan_row = portable.nan_rows(x, n, args.abort_when_nan_found)
    b, V = x.shape
    input_alignment, output_alignment = build.get_alignment_requirement()
    per_row = max(1, output_alignment // 4)
    columns = x.new_empty(b, -(-topk // per_row) * per_row, dtype=torch.int32)[:, :topk]
    build.topk(
        aligned_rows(x, input_alignment), topk, None,
        None if end is None else end.contiguous(), False, True, None, columns, None, -1, float("-inf"), False, False,
    )  # fmt: skip
    cols = columns[:, : min(topk, V)].long()
    if args.sorted:
        # Best first, ties to the lower column (the columns are ascending): the portable kernel's ranking of the
        # selected values; a row's columns past its length rank below every valid one.
        k = cols.shape[1]
        valid = torch.arange(k, device=x.device) < torch.clamp(n, max=topk)[:, None]
        cols = cols.gather(1, portable.selected_columns(x.gather(1, torch.where(valid, cols, 0)), valid, k))
    return portable.finish(args, cols, n, nan_row, idx_dtype)


@kernel(
    device="cuda",
    library="deep_select",
    calls="deep_select.deep_select_cuda.topk",
    takes=_takes_cuda,
    available=DEEP_SELECT_CUDA.available,
)
def topk_select(args):
    return _select(DEEP_SELECT_CUDA, args)


@kernel(
    "topk_select",
    device="npu",
    library="deep_select",
    calls="deep_select.deep_select_npu.topk",
    takes=_takes_npu,
    available=DEEP_SELECT_NPU.available,
)
def topk_select_npu(args):
    return _select(DEEP_SELECT_NPU, args)
