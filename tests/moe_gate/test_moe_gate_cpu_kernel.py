"""moe_topk_gate's C++ CPU kernel against the device-generic kernel (which serves CUDA and NPU): the same bits on every
output, over random shapes, groups, scorings, biases (none, finite, with NaN and infinities, exact ties), masks, fixed
routing, image bias, shared experts through physical maps, EP/TP ranks, FP32 and FP64, non-contiguous logits and
thread counts; the same error words on bad values; and rows taken over threads a few at a time (the results do not
depend on the thread count or on the logits' strides).

ATen's sigmoid, softplus and sqrt round their last few values of a pass (its scalar path) differently from the rest:
the portable kernel's scores depend on where its pass over the whole tensor ends, the logits' memory order and, at
several threads, ATen's split of the tensor. The C++ kernel computes them on row blocks of whole vector steps, in row
order: the portable kernel's bits on row-major logits at one thread, whatever the strides and threads."""

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from torch_ascend_moe.backends.portable import moe_gate as portable

moe_topk_gate = torch.ops.ascend_moe.moe_topk_gate


def _both(*args):
    """(C++ kernel, portable kernel on row-major logits) outputs, asserted bitwise equal (or the same error raised by
    both)."""
    try:
        other = portable.moe_topk_gate(args[0].contiguous(), *args[1:])
    except ValueError as e:
        with pytest.raises(ValueError) as ours_error:
            moe_topk_gate(*args)
        assert str(ours_error.value) == str(e)
        return None
    ours = moe_topk_gate(*args)
    for i, (x, y) in enumerate(zip(ours, other)):
        assert x.dtype == y.dtype and x.shape == y.shape, i
        if x.is_floating_point():
            bits = torch.int64 if x.dtype == torch.float64 else torch.int32
            assert torch.equal(x.contiguous().view(bits), y.contiguous().view(bits)), f"output {i} differs"
        else:
            assert torch.equal(x, y), f"output {i} differs"
    return ours


@st.composite
def gate_calls(draw):
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    groups = draw(st.sampled_from([0, 1, 2, 4, 8]))
    per_group = draw(st.integers(2, 9))
    E = groups * per_group if groups else draw(st.integers(1, 40))
    topk_groups = draw(st.integers(1, groups)) if groups else 0
    k = draw(st.integers(1, E))
    T = draw(st.integers(0, 70))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    kind = draw(st.sampled_from(["normal", "ties", "huge"]))
    if kind == "ties":  # a few distinct values: exact ties everywhere, ±0 among them
        logits = torch.tensor([0.0, -0.0, 1.0, -1.0, 0.5], dtype=dtype)[torch.randint(0, 5, (T, E), generator=g)]
    else:
        logits = torch.randn(T, E, generator=g, dtype=dtype) * (1e4 if kind == "huge" else 1.0)
    if draw(st.booleans()):  # a transposed (non-contiguous) view of the same values
        logits = logits.t().contiguous().t()
    bias_kind = draw(st.sampled_from(["none", "normal", "ties", "nonfinite"]))
    bias = None
    if bias_kind == "normal":
        bias = torch.randn(E, generator=g, dtype=dtype) * 0.1
    elif bias_kind == "ties":
        bias = torch.tensor([0.0, -0.0, 0.25], dtype=dtype)[torch.randint(0, 3, (E,), generator=g)]
    elif bias_kind == "nonfinite":  # the op checks the logits' values, not the bias's: NaN ranks first, as in a sort
        bias = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0], dtype=dtype)[
            torch.randint(0, 4, (E,), generator=g)
        ]
    scoring = draw(st.sampled_from(["sigmoid", "sqrtsoftplus", "softmax", "identity"]))
    mask = torch.rand(T, generator=g) > 0.3 if draw(st.booleans()) else None
    if mask is not None and T:  # masked rows may hold anything, NaN included
        logits = logits.clone()
        logits[~mask] = float("nan")
    if draw(st.booleans()) and T:  # one non-finite logit anywhere: an error where its row is routed
        logits = logits.clone()
        logits[draw(st.integers(0, T - 1)), draw(st.integers(0, E - 1))] = draw(
            st.sampled_from([float("inf"), float("-inf"), float("nan")])
        )
    fix = unmapped = None
    if draw(st.booleans()):
        fix = torch.rand(T, generator=g) > 0.5
        unmapped = torch.randint(-1, E, (T, k), generator=g)
    shared = draw(st.integers(0, 2))
    physical = count = None
    extra = 0
    if shared or draw(st.booleans()):
        extra = draw(st.integers(max(shared, 1), 6))
        physical = torch.randint(-2, E + extra, (E + shared, extra + 1), generator=g, dtype=torch.int32)
        count = torch.randint(1, extra + 2, (E + shared,), generator=g, dtype=torch.int32)
    ep_ranks = draw(st.integers(1, E + extra))
    tp_ranks = draw(st.integers(1, 3))
    image_bias = image_mask = None
    if draw(st.booleans()):
        image_bias = torch.randn(E, generator=g, dtype=dtype)
        image_mask = torch.rand(T, generator=g) > 0.5
    return (
        logits, bias, k, groups, topk_groups, scoring, draw(st.sampled_from([1.0, 2.5])), shared, mask, fix, unmapped,
        physical, count, draw(st.integers(0, ep_ranks - 1)), ep_ranks, draw(st.integers(0, tp_ranks - 1)), tp_ranks,
        image_bias, image_mask, draw(st.booleans()),
    )  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(gate_calls())
def test_cpp_and_portable_agree_bitwise(call):
    ours = _both(*call)
    if ours is not None and not call[0].is_contiguous():  # the strides change nothing
        for x, y in zip(ours, moe_topk_gate(call[0].contiguous(), *call[1:])):
            assert torch.equal(x, y)


@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus", "softmax", "identity"])
@pytest.mark.parametrize(
    ("E", "groups", "topk_groups"), [(256, 0, 0), (256, 8, 4), (256, 8, 8), (72, 0, 0), (75, 3, 1)]
)
def test_many_rows_over_threads(scoring, E, groups, topk_groups):
    """Thousands of rows (many tasks, both threads taking them; DeepSeek-V3's 256 experts, and expert counts whose row
    blocks are not whole vector steps): the same bits at one thread and two, equal to the portable kernel's at one
    thread (at two, ATen's own split of the whole tensor may fall inside a vector step there: its last values then
    take the scalar path, which rounds differently)."""
    g = torch.Generator().manual_seed(E + groups)
    logits, bias = torch.randn(3001, E, generator=g), torch.randn(E, generator=g) * 0.1
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _both(logits, bias, 8, groups, topk_groups, scoring, 2.5)
        torch.set_num_threads(2)
        two = moe_topk_gate(logits, bias, 8, groups, topk_groups, scoring, 2.5)
    finally:
        torch.set_num_threads(previous)
    for x, y in zip(one, two):
        assert torch.equal(x, y)
    if E % 64 == 0:  # a row alone is whole vector steps too: its own bits, whatever the other rows
        row = moe_topk_gate(logits[1234:1235], bias, 8, groups, topk_groups, scoring, 2.5)
        assert torch.equal(row[1][0], one[1][1234]) and torch.equal(row[0][0], one[0][1234])


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("inf", r"argument 'logits' values: expected finite on routed rows, got inf at logits\[5, 3\]"),
        ("nan", r"argument 'logits' values: expected finite on routed rows, got nan at logits\[5, 3\]"),
        ("last", r"argument 'logits' values: expected finite on routed rows, got -inf at logits\[4, 15\]"),
        ("fixed", r"argument 'unmapped_topk_idx' values: expected in \[-1, E=16\) on fix_routing_mask rows, got min"),
        ("count", r"argument 'logical_count' values: expected in \[1, 3\] \(to_physical_map.size\(1\)\), got min 0"),
        ("scoring", r"argument 'scoring_func' value: expected .*, got \"it's\""),
    ],
)
def test_bad_values_read_the_same(change, match):
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 16, generator=g)
    fix, unmapped = torch.zeros(9, dtype=torch.bool), torch.zeros(9, 4, dtype=torch.long)
    physical, count = torch.zeros(17, 3, dtype=torch.int32), torch.ones(17, dtype=torch.int32)
    scoring = "sigmoid"
    if change in ("inf", "nan"):
        logits[5, 3] = float(change)
        logits[7, 1] = float("nan")  # a later row: the first one in row order is named
        logits[2, 9] = float("inf")
        fix = None
    if change == "last":
        logits[4, 15] = float("-inf")
        fix = None
    if change == "fixed":
        fix[4], unmapped[4, 2] = True, 16
    if change == "count":
        count[3] = 0
    if change == "scoring":
        scoring = "it's"
    mask = torch.ones(9, dtype=torch.bool)
    mask[2] = False  # its infinity is not routed: not an error
    call = (logits, None, 4, 0, 0, scoring, 1.0, 1, mask, fix, None if fix is None else unmapped, physical, count)
    for kernel in (moe_topk_gate, portable.moe_topk_gate):
        with pytest.raises(ValueError, match=match):
            kernel(*call)
