"""torch_ascend_moe.deep_select runs code written for DeepSelect: its test grid's argument combinations (judged by
the contract its test checks), its host-side validation and output-layout tests, on CPU tensors."""

import random

import pytest
import torch

import torch_ascend_moe.deep_select as deep_select
from tests.topk_select.oracle import check_topk
from tests.topk_select.test_topk_select_numerics import make_input

# (sorted_value, sorted_index, return_value): the combinations DeepSelect's test runs.
_COMBINATIONS = [
    (False, False, False),
    (False, False, True),
    (True, False, True),
    (False, True, True),
    (False, True, False),
]


def _padded_input(rows, columns, dtype, kind, g):
    """Rows padded to the input stride requirement, then sliced (how DeepSelect's tests allocate)."""
    per_row = deep_select.get_stride_requirement()[0] // dtype.itemsize
    backing = torch.empty(rows, -(-max(columns, 1) // per_row) * per_row, dtype=dtype)
    x = backing[:, :columns]
    x.copy_(make_input(kind, rows, columns, dtype, g))
    return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("combination", _COMBINATIONS)
def test_upstream_grid(dtype, index_dtype, combination):
    sorted_value, sorted_index, return_value = combination
    if sorted_value and dtype == torch.bfloat16:
        pytest.skip("sorted_value is FP32-only upstream")
    rng = random.Random(hash((str(dtype), str(index_dtype), combination)) & 0xFFFF)
    g = torch.Generator().manual_seed(rng.randrange(2**31))
    for rows in (rng.randint(1, 20), 61):
        for columns in (1, rng.randint(2, 500), 1602, 32768):
            for k in (1, rng.randint(2, 500), 512, 2333):
                use_end = k % 2 == 1  # as upstream: ends on odd k, offsets on odd batch sizes
                for kind in ("normal", "normal*1e4" if use_end else "normal/1e4", "bits", "tiny", "nan"):
                    x = _padded_input(rows, columns, dtype, kind, g)
                    end = torch.randint(0, columns, (rows,), generator=g, dtype=torch.int32) if use_end else None
                    offset = (
                        torch.randint(-(2**30), 2**30, (rows,), generator=g, dtype=torch.int32) if rows % 2 else None
                    )
                    values, indices = deep_select.topk(
                        x,
                        k,
                        sorted=sorted_value,
                        end=end,
                        indices_type=index_dtype,
                        sorted_index=sorted_index,
                        output_idx_offset=offset,
                        idx_oob_fill_value=-2000000 + columns,
                        value_oob_fill_value=-1234123412341234,
                        return_value=return_value,
                        abort_when_nan_found=False,
                    )
                    assert (values is None) == (not return_value) and indices.dtype == index_dtype
                    check_topk(
                        x,
                        k,
                        values,
                        indices,
                        end=end,
                        offset=offset,
                        idx_fill=-2000000 + columns,
                        value_fill=-1234123412341234,
                        sorted_values=sorted_value,
                        sorted_index=sorted_index,
                    )


@pytest.mark.parametrize("k", [0, -1, 4097, 2**31])
def test_invalid_topk_is_rejected_before_allocation(k, monkeypatch):
    def no_allocation(*args, **kwargs):
        raise AssertionError("output allocation attempted")

    monkeypatch.setattr(torch, "empty", no_allocation)
    with pytest.raises(ValueError, match="topk"):
        deep_select.topk(torch.ones(2, 64), k, return_value=False)


def test_argument_validation():
    x = torch.ones(2, 256)  # rows of 1024 bytes: upstream's input stride requirement
    with pytest.raises(ValueError, match="begin"):
        deep_select.topk(x, 4, begin=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="hint"):
        deep_select.topk(x, 4, hint=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(TypeError, match="output_idx dtype"):
        deep_select.topk(x, 4, output_idx=torch.empty(2, 4, dtype=torch.int32), indices_type=torch.int64)
    with pytest.raises(RuntimeError, match="only supported for float32"):  # upstream's C++ checks: RuntimeError
        deep_select.topk(x.bfloat16(), 4, sorted=True)
    with pytest.raises(RuntimeError, match="cannot be used at the same time"):
        deep_select.topk(x, 4, sorted=True, sorted_index=True)
    with pytest.raises(RuntimeError, match="must be enabled"):
        deep_select.topk(x, 4, sorted=True, return_value=False)
    with pytest.raises(RuntimeError, match="output_index rows must not overlap"):
        deep_select.topk(
            x, 1, output_idx=torch.empty(1, 8, dtype=torch.int32)[:, :1].expand(2, 1), indices_type=torch.int32
        )
    with pytest.raises(ValueError, match=r"got NaN at input\[1, 3\]"):  # upstream traps the device
        x[1, 3] = float("nan")
        deep_select.topk(x, 4)


def test_layout_checks_as_upstream():
    """The layout DeepSelect's host code demands (its tests/test_memory_boundaries.py, README @ c799e83), refused with
    its words as a RuntimeError; rows padded to the requirement and then sliced pass."""
    for dtype in (torch.float32, torch.bfloat16):
        stride = 1024 // dtype.itemsize
        with pytest.raises(
            RuntimeError,
            match=rf"input.stride\(0\) \(currently 64 numbers\) must be a multiple of 1024 "
            rf"Bytes \({stride} numbers\)",
        ):
            deep_select.topk(torch.ones(2, 64, dtype=dtype), 1)
        width, row_stride = stride + 1, 2 * stride
        x = torch.ones(row_stride + width, dtype=dtype).as_strided((2, width), (row_stride, 1))
        with pytest.raises(RuntimeError, match="input backing storage must include the final row padded"):
            deep_select.topk(x, 1)  # the last row's 128-byte padding lies outside the allocation
        values, _ = deep_select.topk(torch.ones(2, row_stride, dtype=dtype)[:, :width], 1)
        assert torch.equal(values, torch.ones_like(values))
    x = torch.ones(2, 512)
    with pytest.raises(RuntimeError, match=r"input.data_ptr\(\) must be 32-byte aligned"):
        deep_select.topk(x[:, 1:257], 1)
    with pytest.raises(RuntimeError, match="input's last dimension must be contiguous"):
        deep_select.topk(torch.ones(256, 2).t(), 1)
    backing = torch.empty(2, 16, dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"output_index.data_ptr\(\) must be 32-byte aligned"):
        deep_select.topk(x, 1, output_idx=backing[:, 1:2], indices_type=torch.int32)
    with pytest.raises(
        RuntimeError, match=r"output_index.stride\(0\) \(currently 4 numbers\) must be a multiple of 32"
    ):
        deep_select.topk(x, 1, output_idx=torch.empty(2, 4, dtype=torch.int32)[:, :1], indices_type=torch.int32)
    # One row has no other row to reach: any row stride (DeepSelect's interface test calls with a [1, 32] FP32 input).
    values, _ = deep_select.topk(torch.arange(32.0)[None], 2, sorted=True)
    assert values.tolist() == [[31.0, 30.0]]
    # The interface's own checks come first: a wrong output_idx dtype is a TypeError even with a misaligned input.
    with pytest.raises(TypeError, match="output_idx dtype"):
        deep_select.topk(torch.ones(2, 64), 1, output_idx=torch.empty(2, 1, dtype=torch.int32))
    # the smallest output upstream accepts: 36 bytes, rows 32 bytes apart
    output = torch.empty(9, dtype=torch.int32).as_strided((2, 1), (8, 1))
    _, indices = deep_select.topk(
        torch.ones(2, 256), 1, end=torch.ones(2, dtype=torch.int32), output_idx=output, indices_type=torch.int32
    )
    assert indices is output and torch.equal(indices, torch.zeros_like(indices))


def test_output_layout_and_caller_buffers():
    x = torch.arange(2048, dtype=torch.float32).repeat(2, 1)
    values, indices = deep_select.topk(x, 1)
    assert values.stride(0) * values.element_size() % 32 == 0 and indices.stride(0) * indices.element_size() % 32 == 0
    values, indices = deep_select.topk(torch.ones(2, 256), 4096)  # k above the vocabulary is allowed
    assert values.shape == indices.shape == (2, 4096)
    for dtype in (torch.int32, torch.int64):
        for k in (1, 3, 17, 1025):
            for end_value in (min(k, 5), 2048):
                width = (k + 31) // 32 * 32 + 32
                backing = torch.full((2, width), -123, dtype=dtype)
                output = backing[:, :k]
                end = torch.full((2,), end_value, dtype=torch.int32)
                values, returned = deep_select.topk(x, k, end=end, indices_type=dtype, output_idx=output)
                assert returned is output and (backing[:, k:] == -123).all()  # nothing written past the view
                count = min(k, end_value)
                expected = x[:, :end_value].topk(count).values.sort(dim=1).values
                assert torch.equal(values[:, :count].sort(dim=1).values, expected)
    supplied = torch.empty(2, 4, dtype=torch.int64)
    values, indices = deep_select.topk(torch.ones(2, 256), 4, return_value=False, output_idx=supplied)
    assert values is None and indices is supplied


def test_sampler_call_as_rtp_llm_makes_it():
    """A DeepSeek-V4.1 serving stack's sampler call: FP32 logits, int32 indices, -1 fill, values gathered after."""
    assert deep_select.get_stride_requirement() == (1024, 32)
    logits = torch.randn(6, 129280)
    _, indices = deep_select.topk(
        logits,
        512,
        sorted=False,
        indices_type=torch.int32,
        idx_oob_fill_value=-1,
        return_value=False,
        abort_when_nan_found=False,
    )
    picked = logits.gather(1, indices.long()).sort(dim=1, descending=True).values
    assert torch.equal(picked, logits.topk(512).values)


def test_compiles_fullgraph():
    """A compiled caller (a sampler inside a compiled model) traces the call whole: the layout checks on strides hold
    while tracing, the address checks are skipped there (fake tensors have no addresses)."""
    torch._dynamo.reset()
    x = torch.randn(4, 256)
    compiled = torch.compile(lambda x: deep_select.topk(x, 4, indices_type=torch.int32), fullgraph=True)
    values, indices = compiled(x)
    want_values, want_indices = deep_select.topk(x, 4, indices_type=torch.int32)
    assert torch.equal(values, want_values) and torch.equal(indices, want_indices)
    torch._dynamo.reset()
