"""The topk_select family on Ascend: an adapter onto DeepSelect's own Ascend build (deepseek-ai/DeepSelect's
``deep_select.deep_select_npu`` extension, a pybind module, not a torch_npu op; specs/tilekernels_deepselect.md
§11) where that package is installed; the portable kernel otherwise (a ``torch.topk`` of packed int64 keys: ACLNN
ops on an NPU). torch_npu 2.13 has no top-k of its own beyond ``torch.topk``.

What the Ascend build takes (its ``interface.py`` and ``tests/test.py`` @ 0cae3b1, ``csrc/ascend_kernels/config.h``),
so what the adapter hands it, every other call staying portable:

* BF16 input, ``sorted=False`` only, int32 indices only, ``topk <= 4096``, ``V <= 2**21 - 1``.
* Rows whose stride (bytes) is a multiple of the build's ``get_alignment_requirement()[0]``, 32-byte aligned data:
  other inputs are copied into such rows first.
* Its ties are arbitrary (a valid top-k set, not ours: equal keys to the lower column), so results equal the CPU
  kernel's where no two candidates tie, and are a valid top-k (DeepSelect's own test contract) everywhere.

The adapter asks it for the selected columns only (``sorted_index=True``: ascending columns, the op's order; no
offsets, no values); values, offsets (with the int32 wrap check), fills and NaN rows are the portable kernel's
own steps, so those semantics are identical on every device. The NaN check is the portable one too (a device
reduction; the abort reads it on the host, as the portable kernel does).

Verified how: ``tests/npu/test_deep_select_ascend_adapter.py`` installs a stand-in ``deep_select.deep_select_npu``
with the build's signature and restrictions, breaking ties at random; not run on Ascend.
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.chain import first_refusal, kernel
from torch_ascend_moe.backends.portable import topk_select as portable
from torch_ascend_moe.backends.upstream import Library
from torch_ascend_moe.meta import topk_select as meta

MAX_TOPK = 4096
MAX_COLUMNS = 2 * 1024 * 1024 - 1
_OUTPUT_ALIGNMENT = 32  # bytes: the build's output row-stride requirement (DeepSelect's interface rounds to it)


# DeepSelect's Ascend extension module.
DEEP_SELECT_NPU = Library("deep_select.deep_select_npu")


def fits(input, topk, sorted) -> bool:
    """Whether the Ascend build computes this call (see the module docstring)."""
    b, V = input.shape
    return input.dtype == torch.bfloat16 and not sorted and topk <= MAX_TOPK and 0 < V <= MAX_COLUMNS and b > 0


def _aligned_rows(x: torch.Tensor, alignment: int) -> torch.Tensor:
    """``x`` itself when its rows meet the build's layout, else a copy into rows padded to ``alignment`` bytes."""
    per_row = max(1, alignment // x.element_size())
    if x.stride(1) == 1 and x.stride(0) % per_row == 0 and x.data_ptr() % 32 == 0:
        return x
    padded = x.new_empty(x.shape[0], -(-x.shape[1] // per_row) * per_row)
    return padded[:, : x.shape[1]].copy_(x)


def _takes(args):
    meta.topk_select_signature(args)
    fits_ = fits(args.input, args.topk, args.sorted)
    return first_refusal(None if fits_ else f"not BF16 unsorted top-k of at most {MAX_TOPK} from 1..{MAX_COLUMNS}")


@kernel(
    device="npu",
    library="deep_select",
    calls="deep_select.deep_select_npu.topk",
    takes=_takes,
    available=DEEP_SELECT_NPU.available,
)
def topk_select(args):
    idx_dtype = meta.topk_select_signature(args)
    x, topk, end = args.input, args.topk, args.end
    backend = DEEP_SELECT_NPU.module()
    n = portable.row_lengths(x, end)
    nan_row = portable.nan_rows(x, n, args.abort_when_nan_found)
    b, V = x.shape
    per_row = _OUTPUT_ALIGNMENT // 4
    columns = x.new_empty(b, -(-topk // per_row) * per_row, dtype=torch.int32)[:, :topk]
    backend.topk(
        _aligned_rows(x, backend.get_alignment_requirement()[0]), topk, None,
        None if end is None else end.contiguous(), False, True, None, columns, None, -1, float("-inf"), False, False,
    )  # fmt: skip
    return portable.finish(args, columns[:, : min(topk, V)].long(), n, nan_row, idx_dtype)
