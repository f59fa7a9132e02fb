"""Control surface of the ``deep_select`` stand-in (not DeepSelect's API): ``configure(flavor)``, ``CALLS`` (one
``(extension, {argument: description})`` per ``topk`` call, appended before any check), ``reset()``, ``Panic``."""

from __future__ import annotations

import torch

CALLS: list = []
FLAVOR = ["cuda"]
# csrc/cuda_kernels/config.h / ascend_kernels/config.h: INPUT_/OUTPUT_STRIDE_ALIGNMENT_REQUIREMENT (bytes); the CUDA
# values are the ones a caller pins ((1024, 32), specs §13), the Ascend input value is this stand-in's choice.
ALIGNMENT = {"cuda": (1024, 32), "npu": (64, 32)}
MAX_VOCAB = {"cuda": 2**23, "npu": 2 * 1024 * 1024}
TILE = 128


class Panic(RuntimeError):
    """The real kernel would not raise here: it would read out of bounds or trap on the device."""


def configure(flavor: str = "cuda") -> None:
    if flavor not in ("cuda", "npu"):
        raise ValueError(f"deep_select stand-in: flavor must be 'cuda' or 'npu', got {flavor!r}")
    FLAVOR[0] = flavor


def reset() -> None:
    CALLS.clear()


def describe(v):
    if isinstance(v, torch.Tensor):
        return (v.dtype, tuple(v.shape), tuple(v.stride()), v.data_ptr())
    return v


def check(cond: bool, message: str) -> None:
    if not cond:
        raise RuntimeError(message)


def topk(flavor, input, topk, begin, end, sorted_value, sorted_index, output_value, output_index, output_idx_offset,
         idx_oob_fill_value, value_oob_fill_value, return_value, abort_when_nan_found):  # fmt: skip
    names = ("input", "topk", "begin", "end", "sorted_value", "sorted_index", "output_value", "output_index",
             "output_idx_offset", "idx_oob_fill_value", "value_oob_fill_value", "return_value",
             "abort_when_nan_found")  # fmt: skip
    values = (input, topk, begin, end, sorted_value, sorted_index, output_value, output_index, output_idx_offset,
              idx_oob_fill_value, value_oob_fill_value, return_value, abort_when_nan_found)  # fmt: skip
    CALLS.append((f"deep_select_{flavor}.topk", {n: describe(v) for n, v in zip(names, values)}))
    b, V = input.shape
    # api.cpp, in its order
    check(topk > 0, "topk must > 0")
    check(topk <= 4096, "topk must be <= 4096")
    check(not (sorted_value and not return_value), "`return_value` must be enabled when `sorted_value` is True")
    check(not (sorted_value and sorted_index), "`sorted_value` and `sorted_index` cannot be used at the same time")
    check(begin is None, "`begin` is not supported currently")
    if return_value:
        check(output_value is not None, "`output_value` must not be `None` when `return_value` is True")
    else:
        check(output_value is None, "`output_value` must be `None` when `return_value` is False")
    shapes = {"end": (end, (b,)), "output_value": (output_value, (b, topk)),
              "output_index": (output_index, (b, topk)), "output_idx_offset": (output_idx_offset, (b,))}  # fmt: skip
    for name, (t, shape) in shapes.items():
        if t is not None:
            check(tuple(t.shape) == shape, f"{name} shape mismatch: expected {shape}, got {tuple(t.shape)}")
    for name, t in (("end", end), ("output_idx_offset", output_idx_offset)):
        if t is not None:
            check(t.dtype == torch.int32, f"{name} dtype mismatch")
            check(t.is_contiguous(), f"{name} must be contiguous")
    if output_value is not None:
        check(output_value.dtype == input.dtype, "output_value dtype mismatch")
    for name, t in (("input", input), ("output_value", output_value), ("output_index", output_index)):
        if t is not None:
            check(t.stride(1) == 1, f"{name}'s last dim must be contiguous")
    in_align, out_align = ALIGNMENT[flavor]
    for name, t, align in (("input", input, in_align), ("output_index", output_index, out_align),
                           ("value", output_value, out_align)):  # fmt: skip
        if t is not None:
            check(
                t.stride(0) * t.element_size() % align == 0,
                f"{name}.stride(0) (currently {t.stride(0)} numbers) must be a multiple of {align} Bytes "
                f"({align // t.element_size()} numbers)",
            )
    if flavor == "cuda":
        check(input.dtype in (torch.bfloat16, torch.float32), "input dtype must be bfloat16 or float32")
        check(
            not (sorted_value and input.dtype == torch.bfloat16), "`sorted_value` is only supported for float32 input"
        )
        kind = "bfloat16" if input.dtype == torch.bfloat16 else "float32"
        check(V < MAX_VOCAB[flavor], f"vocab_size must be < 2^23 for {kind} input")
        check(output_index.dtype in (torch.int32, torch.int64), "output_idx dtype must be int32 or int64")
        # README @ c799e83: TMA reads whole 128-byte tiles; the data 32-byte aligned
        if input.data_ptr() % 32:
            raise Panic("input not 32-byte aligned (TMA)")
        last = (input.storage_offset() + (b - 1) * input.stride(0)) * input.element_size()
        if last + -(-V * input.element_size() // TILE) * TILE > input.untyped_storage().nbytes():
            raise Panic("the allocation does not cover the last row rounded up to 128 bytes (TMA tiles)")
    else:
        check(input.dtype == torch.bfloat16, "input dtype must be bfloat16 on Ascend")
        check(output_index.dtype == torch.int32, "output_idx dtype must be torch.int32 on Ascend")
        check(not sorted_value, "sorting by value is not supported on Ascend")
        check(V < MAX_VOCAB[flavor], "vocab_size must be < 2M for bfloat16 input")
    if end is not None and bool((end > V).any()):
        raise Panic("end > vocab_size: the kernel reads past the row")
    g = torch.Generator().manual_seed(len(CALLS))
    for i in range(b):
        n = V if end is None else int(end[i])
        row = input[i, :n].float()
        if row.isnan().any() and (flavor == "npu" or n > topk):
            if abort_when_nan_found:
                raise Panic(f"NaN in row {i}: the kernel traps")
            if flavor == "npu":
                output_index[i] = 0x3F3F3F3F
            else:
                output_index[i, 0] = 0x3F3F3F3F
            continue
        tie_breaker = torch.rand(n, generator=g).tolist()
        order = sorted(range(n), key=lambda c: (-float(row[c]), tie_breaker[c]))[:topk]
        if sorted_index:
            order = sorted(order)
        chosen = torch.tensor(order, dtype=torch.int64)
        if output_idx_offset is not None:
            chosen = chosen + int(output_idx_offset[i])
        output_index[i, : len(order)] = chosen.to(output_index.dtype)
        output_index[i, len(order) :] = idx_oob_fill_value
        if output_value is not None:
            output_value[i, : len(order)] = input[i, order]
            output_value[i, len(order) :] = value_oob_fill_value
