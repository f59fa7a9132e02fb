"""``topk_select`` through DeepSelect's own builds (``backends/upstream/deep_select.py``): the stand-in
``deep_select`` (``tests/standins/deep_select``: each extension's ``topk`` signature, ``api.cpp``'s host checks, ties
broken at random) installed as the CUDA or the Ascend build, the device's chain run on CPU tensors."""

from __future__ import annotations

import pytest
import torch

from tests.chains import cuda_chain, npu_chain
from tests.topk_select.oracle import check_topk
from tests.upstream.standin import installed
from torch_ascend_moe import topk_select
from torch_ascend_moe.backends import chain

CHAINS = {"cuda": cuda_chain, "npu": npu_chain}


@pytest.fixture(params=["cuda", "npu"])
def build(request):
    with installed("deep_select", flavor=request.param) as library:
        yield request.param, library._standin


def _call(flavor, x, k, end=None, offset=None, sorted=False, indices_dtype=None, abort=True):
    return CHAINS[flavor].topk_select(x, k, end, offset, sorted, indices_dtype, -5, None, abort)


def _reached(standin) -> list[str]:
    return [name for name, _ in standin.CALLS]


def test_indexer_calls_reach_the_build_and_give_a_valid_topk(build):
    flavor, standin = build
    g = torch.Generator().manual_seed(0)
    backing = torch.randn(5, 3000, generator=g).mul(4).round().bfloat16()  # many ties
    x = backing[:, 3:2003]  # misaligned rows: copied into aligned ones first
    end = torch.tensor([2000, 100, 0, 7, 1500], dtype=torch.int32)
    offset = torch.randint(-1000, 1000, (5,), generator=g, dtype=torch.int32)
    for indices_dtype in (torch.int32, None):
        values, indices = _call(flavor, x, 64, end, offset, indices_dtype=indices_dtype)
        check_topk(x, 64, values, indices, end=end, offset=offset, idx_fill=-5, sorted_index=True)
    assert _reached(standin) == [f"deep_select_{flavor}.topk"] * 2
    passed = standin.CALLS[0][1]
    assert passed["sorted_index"] and not passed["sorted_value"] and not passed["return_value"]
    assert passed["output_index"][0] == torch.int32 and passed["output_idx_offset"] is None
    in_align = standin.ALIGNMENT[flavor][0]
    assert passed["input"][2][0] * 2 % in_align == 0 and passed["input"][3] % 32 == 0


def test_equal_to_the_cpu_kernel_without_ties(build):
    flavor, standin = build
    x = torch.randperm(256).bfloat16().view(2, 128)  # distinct values (BF16 holds integers below 256 exactly)
    for sorted_ in (False, True):
        for k in (1, 5, 64, 128, 300):
            ours = _call(flavor, x, k, sorted=sorted_)
            cpu = topk_select(x, k, sorted=sorted_, idx_oob_fill_value=-5)
            assert torch.equal(ours[0].float(), cpu[0].float()) and torch.equal(ours[1], cpu[1]), (sorted_, k)
    assert len(standin.CALLS) == 10


def test_sorted_ranks_ties_as_ours(build):
    """``sorted=True``: the build's set (a valid top-k), ranked by our keys: value descending, -0.0 below +0.0, ties
    to the lower column; equal to the CPU kernel whenever the set is the same (no tie at the boundary)."""
    flavor, standin = build
    row = torch.tensor([0.0, -0.0, 3.0, 3.0, -1.0, 0.0, 2.0, -0.0] * 4).bfloat16()
    x = torch.stack([row, row.flip(0)])
    values, indices = _call(flavor, x, 32, sorted=True)
    cpu = topk_select(x, 32, sorted=True, idx_oob_fill_value=-5)
    assert torch.equal(indices, cpu[1]) and torch.equal(values.view(torch.int16), cpu[0].view(torch.int16))
    assert _reached(standin) == [f"deep_select_{flavor}.topk"]


def test_nan_rows_and_aborts_are_the_ops(build):
    flavor, standin = build
    x = torch.randn(3, 200).bfloat16()
    x[1, 50] = float("nan")
    values, indices = _call(flavor, x, 16, abort=False)
    assert (indices[1] == 0x3F3F3F3F).all() and values[1].isnan().all()
    check_topk(x, 16, values, indices, idx_fill=-5, sorted_index=True)
    with pytest.raises(ValueError, match=r"got NaN at input\[1, 50\]"):
        _call(flavor, x, 16)
    # the build is asked never to abort (our NaN check decides, with our words)
    assert all(not args["abort_when_nan_found"] for _, args in standin.CALLS)


def test_rows_that_would_read_past_their_allocation_are_copied(build):
    flavor, standin = build
    dtype = torch.float32 if flavor == "cuda" else torch.bfloat16
    per_row, V = standin.ALIGNMENT[flavor][0] // dtype.itemsize, 253
    # aligned rows, the allocation ending with the last row's data: its last 128-byte tile would run past it
    x = torch.randn(3 * per_row + V).to(dtype).as_strided((4, V), (per_row, 1))
    values, indices = _call(flavor, x, 8)
    check_topk(x, 8, values, indices, idx_fill=-5, sorted_index=True)
    assert len(standin.CALLS) == 1  # no Panic: whole tiles stay inside what it was given


def test_calls_outside_the_build_stay_portable(build):
    flavor, standin = build
    x = torch.randn(2, 300)
    calls = [
        lambda: _call(flavor, x.double(), 8),  # FP64
        lambda: _call(flavor, x.bfloat16(), 5000),  # k above the builds' 4096
        lambda: _call(flavor, x.half(), 8),  # FP16
    ]
    if flavor == "npu":
        calls.append(lambda: _call(flavor, x, 8))  # FP32: Ascend is BF16 only
    for call in calls:
        call()
    assert standin.CALLS == []
    steps = chain.explain("topk_select", flavor, x.double(), 8)
    assert steps[0].status == "refused" and "torch.float64 input" in steps[0].reason, steps
    with chain.disabled("deep_select"):
        assert torch.equal(_call(flavor, x.bfloat16(), 8)[1], topk_select(x.bfloat16(), 8, idx_oob_fill_value=-5)[1])
    assert standin.CALLS == []


def test_bad_input_gets_our_words_and_never_reaches_the_build(build):
    flavor, standin = build
    x = torch.randn(2, 300).bfloat16()
    with pytest.raises(ValueError, match="ascend_moe::topk_select: argument 'end'"):
        _call(flavor, x, 8, end=torch.tensor([301, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="ascend_moe::topk_select: argument 'topk'"):
        _call(flavor, x, 0)
    assert standin.CALLS == []


def test_the_other_build_and_no_package_are_not_taken():
    with installed("deep_select", flavor="npu") as library:
        steps = chain.explain("topk_select", "cuda", torch.randn(2, 64).bfloat16(), 4)
        assert steps[0].status == "not available", steps
        _call("cuda", torch.randn(2, 64).bfloat16(), 4)
        assert library._standin.CALLS == []
    chain.refresh()
    x = torch.randn(2, 100).bfloat16()
    for flavor in CHAINS:
        assert torch.equal(_call(flavor, x, 4)[1], topk_select(x, 4, idx_oob_fill_value=-5)[1])


def test_every_contract_sample_it_takes_is_a_valid_topk(build):
    """The op contract's samples (quarter-rounded values: many ties, -0.0 beside +0.0; ends, offsets, sorted, int32)
    through the build's chain: every one the build takes (at least two per dtype it serves) gives a valid top-k by
    DeepSelect's contract with our fills, offsets and order; the rest are bitwise the chain without it."""
    from tests.topk_select.specs import samples

    flavor, standin = build
    reached = {}
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for s in samples("cpu", dtype) + samples("cpu", dtype, small=True):
            x, k, end, offset, sorted_, index_dtype, idx_fill, value_fill, abort = s.args
            before = len(standin.CALLS)
            values, indices = CHAINS[flavor].topk_select(*s.args)
            if len(standin.CALLS) == before:
                with chain.disabled("deep_select"):
                    want = CHAINS[flavor].topk_select(*s.args)
                assert torch.equal(values, want[0]) and torch.equal(indices, want[1]), s.name
                continue
            reached[dtype] = reached.get(dtype, 0) + 1
            fill = torch.tensor(value_fill, dtype=torch.float64).to(x.dtype).item()
            check_topk(x, k, values, indices, end=end, offset=offset, idx_fill=idx_fill, value_fill=fill,
                       sorted_values=sorted_, sorted_index=not sorted_)  # fmt: skip
            assert indices.dtype == (index_dtype or torch.int64), s.name
    served = (torch.bfloat16, torch.float32) if flavor == "cuda" else (torch.bfloat16,)
    assert all(reached.get(d, 0) >= 2 for d in served) and set(reached) <= set(served), reached
