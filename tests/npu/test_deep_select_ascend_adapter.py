"""The topk_select adapter onto DeepSelect's Ascend build (backends/npu/topk_select.py). No Ascend here: a
stand-in ``deep_select.deep_select_npu`` module has the build's ``topk`` signature and restrictions (BF16, int32
indices, unsorted, aligned input rows, k <= 4096) and breaks ties at random, as the real kernel may; the adapter is
called directly with CPU tensors, as ``npu_kernel`` documents."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from tests.chains import npu_chain
from tests.topk_select.oracle import check_topk
from torch_ascend_moe import topk_select
from torch_ascend_moe.backends import chain

CALLS: list[dict] = []
_ALIGNMENT = 64


def _standin_topk(x, k, begin, end, sorted_value, sorted_index, out_val, out_idx, offset, idx_fill, value_fill,
                  return_value, abort):  # fmt: skip
    assert x.dtype == torch.bfloat16 and out_idx.dtype == torch.int32 and not sorted_value and begin is None
    assert x.stride(1) == 1 and x.stride(0) * 2 % _ALIGNMENT == 0 and x.data_ptr() % 32 == 0
    assert out_idx.shape == (x.shape[0], k) and out_idx.stride(0) * 4 % 32 == 0 and k <= 4096
    assert out_val is None and not return_value and offset is None and not abort
    CALLS.append({"sorted_index": sorted_index})
    g = torch.Generator().manual_seed(len(CALLS))
    for i in range(x.shape[0]):
        n = x.shape[1] if end is None else int(end[i])
        row = x[i, :n].float()
        if row.isnan().any():
            out_idx[i] = 0x3F3F3F3F
            continue
        # Value descending, ties in a random order: a valid top-k set that is not the CPU kernel's.
        tie_breaker = torch.rand(n, generator=g).tolist()
        order = sorted(range(n), key=lambda c: (-float(row[c]), tie_breaker[c]))[:k]
        chosen = sorted(order) if sorted_index else order
        out_idx[i, : len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
        out_idx[i, len(chosen) :] = idx_fill


@pytest.fixture
def standin(monkeypatch):
    module = types.ModuleType("deep_select.deep_select_npu")
    module.get_alignment_requirement = lambda: (_ALIGNMENT, 32)
    module.topk = _standin_topk
    monkeypatch.setitem(sys.modules, "deep_select", types.ModuleType("deep_select"))
    monkeypatch.setitem(sys.modules, "deep_select.deep_select_npu", module)
    chain.refresh()
    CALLS.clear()
    yield
    chain.refresh()


def _call(x, k, end=None, offset=None, sorted=False, indices_dtype=None, abort=True):
    return npu_chain.topk_select(x, k, end, offset, sorted, indices_dtype, -5, None, abort)


def test_indexer_calls_reach_the_build_and_give_a_valid_topk(standin):
    g = torch.Generator().manual_seed(0)
    backing = torch.randn(5, 3000, generator=g).mul(4).round().bfloat16()  # many ties
    x = backing[:, 3:2003]  # misaligned rows: copied into aligned ones first
    end = torch.tensor([2000, 100, 0, 7, 1500], dtype=torch.int32)
    offset = torch.randint(-1000, 1000, (5,), generator=g, dtype=torch.int32)
    for indices_dtype in (torch.int32, None):
        values, indices = _call(x, 64, end, offset, indices_dtype=indices_dtype)
        check_topk(x, 64, values, indices, end=end, offset=offset, idx_fill=-5, sorted_index=True)
    assert CALLS == [{"sorted_index": True}] * 2


def test_equal_to_the_cpu_kernel_without_ties(standin):
    x = torch.randperm(256).bfloat16().view(2, 128)  # distinct values (BF16 holds integers below 256 exactly)
    for k in (1, 5, 64, 128, 300):
        ours = _call(x, k)
        cpu = topk_select(x, k, idx_oob_fill_value=-5)
        assert torch.equal(ours[0].float(), cpu[0].float()) and torch.equal(ours[1], cpu[1])


def test_nan_rows_and_aborts_are_the_ops(standin):
    x = torch.randn(3, 200).bfloat16()
    x[1, 50] = float("nan")
    values, indices = _call(x, 16, abort=False)
    assert (indices[1] == 0x3F3F3F3F).all() and values[1].isnan().all()
    check_topk(x, 16, values, indices, idx_fill=-5, sorted_index=True)
    with pytest.raises(ValueError, match=r"got NaN at input\[1, 50\]"):
        _call(x, 16)


def test_calls_outside_the_build_stay_portable(standin):
    x = torch.randn(2, 300)
    for call in (
        lambda: _call(x, 8),  # FP32
        lambda: _call(x.bfloat16(), 8, sorted=True),  # sorted values
        lambda: _call(x.bfloat16(), 5000),  # k above the build's 4096
    ):
        call()
    assert CALLS == []
    assert torch.equal(_call(x, 8)[1], topk_select(x, 8, idx_oob_fill_value=-5)[1])


def test_without_the_package_everything_is_portable():
    chain.refresh()
    x = torch.randn(2, 100).bfloat16()
    assert torch.equal(_call(x, 4)[1], topk_select(x, 4, idx_oob_fill_value=-5)[1])
