"""topk_select against DeepSelect's contract (tests/topk_select/oracle.py) on its input distributions: normal
values shifted and scaled by up to 1e4, uniform bit patterns (±0, subnormals, ±inf), tiny integer bit patterns
(massive ties), NaN hot spots; random shapes, ends, offsets, index dtypes, orders and fills (hypothesis). The C++
and portable kernels must also agree bitwise (one tie rule on every path)."""

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given, settings

from tests.topk_select.oracle import NAN_MARKER, check_topk
from torch_ascend_moe import topk_select
from torch_ascend_moe.backends.portable import topk_select as portable

_UINT = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}
# (+0, +inf, NaN) bit patterns per dtype, as DeepSelect's test generator spells them.
_PATTERNS = {
    torch.bfloat16: (0x0000, 0x7F80, 0x7F81),
    torch.float16: (0x0000, 0x7C00, 0x7C01),
    torch.float32: (0x00000000, 0x7F800000, 0x7F800001),
    torch.float64: (0, 0x7FF0000000000000, 0x7FF0000000000001),
}


def make_input(kind: str, rows: int, columns: int, dtype, g: torch.Generator) -> torch.Tensor:
    """One of DeepSelect's test distributions (our own generator)."""
    zero, inf, nan = _PATTERNS[dtype]
    if kind.startswith("normal"):
        x = torch.randn(rows, columns, generator=g, dtype=torch.float64)
        scale = {"normal": 1, "normal+100": 1, "normal*1e4": 1e4, "normal/1e4": 1e-4}[kind]
        return (x * scale + (100 if kind == "normal+100" else 0)).to(dtype)
    if kind in ("bits", "tiny", "nan"):
        hi = {"bits": inf + 1, "tiny": 0x20, "nan": inf + 1}[kind]
        mag = torch.randint(zero, hi, (rows, columns), generator=g, dtype=torch.int64)
        # The signed view of a pattern with the sign bit set is its magnitude minus 2^(width-1).
        low = -(1 << (torch.finfo(dtype).bits - 1))
        raw = torch.where(torch.rand(rows, columns, generator=g) < 0.5, mag + low, mag)
        if kind == "nan" and columns:  # a few NaN (both signs) at random columns of every row
            spots = torch.randint(0, columns, (rows, min(8, columns)), generator=g)
            signed = torch.where(torch.rand(spots.shape, generator=g) < 0.5, nan, nan + low)
            raw.scatter_(1, spots, signed)
        return raw.to(_UINT[dtype]).view(dtype)
    raise ValueError(kind)


def run_both(x, k, **kw):
    """(C++ kernel, portable kernel) results, asserted bitwise equal."""
    ours = topk_select(
        x,
        k,
        kw.get("end"),
        kw.get("offset"),
        sorted=kw.get("sorted", False),
        indices_dtype=kw.get("indices_dtype"),
        idx_oob_fill_value=kw.get("idx_fill", 2147483647),
        value_oob_fill_value=kw.get("value_fill"),
        abort_when_nan_found=False,
    )
    other = portable.topk_select(
        x,
        k,
        kw.get("end"),
        kw.get("offset"),
        kw.get("sorted", False),
        kw.get("indices_dtype"),
        kw.get("idx_fill", 2147483647),
        kw.get("value_fill"),
        False,
    )
    bits = _UINT[x.dtype]
    assert torch.equal(ours[1], other[1]), "C++ and portable indices differ"
    assert torch.equal(ours[0].view(bits), other[0].view(bits)), "C++ and portable values differ"
    return ours


@settings(max_examples=200, deadline=None)
@given(
    rows=st.integers(0, 6),
    columns=st.integers(0, 2500),
    k=st.one_of(st.integers(1, 40), st.integers(200, 700)),
    dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.float16, torch.float64]),
    kind=st.sampled_from(["normal", "normal+100", "normal*1e4", "normal/1e4", "bits", "tiny", "nan"]),
    with_end=st.booleans(),
    with_offset=st.booleans(),
    int32=st.booleans(),
    order=st.sampled_from(["index", "value"]),
    fills=st.sampled_from([(2147483647, None), (-2000000, -1234123412341234.0), (-1, 0.5)]),
    seed=st.integers(0, 2**31),
)
def test_deepselect_contract(rows, columns, k, dtype, kind, with_end, with_offset, int32, order, fills, seed):
    g = torch.Generator().manual_seed(seed)
    x = make_input(kind, rows, columns, dtype, g)
    end = torch.randint(0, columns + 1, (rows,), generator=g, dtype=torch.int32) if with_end else None
    offset = torch.randint(-(2**30), 2**30, (rows,), generator=g, dtype=torch.int32) if with_offset else None
    idx_fill, value_fill = fills
    values, indices = run_both(
        x,
        k,
        end=end,
        offset=offset,
        sorted=order == "value",
        indices_dtype=torch.int32 if int32 else None,
        idx_fill=idx_fill,
        value_fill=value_fill,
    )
    assert indices.dtype == (torch.int32 if int32 else torch.int64)
    check_topk(
        x,
        k,
        values,
        indices,
        end=end,
        offset=offset,
        idx_fill=idx_fill,
        value_fill=float("-inf") if value_fill is None else value_fill,
        sorted_values=order == "value",
        sorted_index=order == "index",
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("k", [512, 2048, 4096])
def test_indexer_and_sampler_sizes(dtype, k):
    """DeepSelect's benchmark regimes: long indexer rows (2^20 positions) and a 129280-entry vocabulary."""
    g = torch.Generator().manual_seed(k)
    for rows, columns in ((2, 1 << 20), (3, 129280)):
        x = (torch.randn(rows, columns, generator=g) * 3).to(dtype)
        values, indices = run_both(x, k, sorted=dtype == torch.float32)
        check_topk(x, k, values, indices, sorted_values=dtype == torch.float32, sorted_index=dtype != torch.float32)
        expected = torch.topk(x.float(), k).values.sort(dim=1).values  # the same multiset as torch.topk
        assert torch.equal(values.float().sort(dim=1).values, expected)


def test_ties_and_signed_zeros_follow_the_documented_order():
    x = torch.tensor([[0.0, -0.0, 1.0, 1.0, -0.0, 0.0, float("-inf"), 1.0]])
    values, indices = topk_select(x, 5, sorted=True)
    assert indices.tolist() == [[2, 3, 7, 0, 5]]  # 1.0 by column, then +0.0 before -0.0
    values, indices = topk_select(x, 6)
    assert indices.tolist() == [[0, 1, 2, 3, 5, 7]]  # unsorted: ascending columns
    assert torch.signbit(values).tolist() == [[False, True, False, False, False, False]]


def test_nan_rows():
    x = torch.randn(4, 50)
    x[1, 30] = float("nan")
    x[2, 45] = -float("nan")
    end = torch.tensor([50, 50, 40, 3], dtype=torch.int32)  # row 2's NaN lies past its end
    x[3, 1] = float("nan")  # a short row (end <= topk) is checked too
    values, indices = topk_select(x, 8, end, abort_when_nan_found=False)
    assert (indices[[1, 3]] == NAN_MARKER).all() and values[[1, 3]].isnan().all()
    check_topk(x, 8, values, indices, end=end, sorted_index=True)
    with pytest.raises(ValueError, match=r"got NaN at input\[1, 30\]"):
        topk_select(x, 8, end)
    with pytest.raises(ValueError, match=r"got NaN at input\[1, 30\]"):
        portable.topk_select(x, 8, end)


@pytest.mark.parametrize("int32", [False, True])
def test_offsets_at_the_int32_limits(int32):
    """DeepSelect's offset cases: selection, exact-size and partial short rows, empty rows, extreme fills."""
    columns, k = 512, 8
    offsets = torch.tensor([0, 1, -1, 5] if int32 else [2**31 - 1, -(2**31), -1, 0], dtype=torch.int32)
    x = torch.arange(columns, dtype=torch.float32).repeat(len(offsets), 1)
    for end_value in (columns, k, 3, 0):
        for fill in (2**31 - 1, -(2**31), -1):
            end = torch.full_like(offsets, end_value)
            values, indices = run_both(
                x, k, end=end, offset=offsets, sorted=True, idx_fill=fill, indices_dtype=torch.int32 if int32 else None
            )
            count = min(end_value, k)
            selected = torch.arange(end_value - 1, end_value - count - 1, -1)
            expected = torch.full((len(offsets), k), fill, dtype=torch.int64)
            expected[:, :count] = selected + offsets.long()[:, None]
            assert torch.equal(indices.long(), expected)
            assert torch.equal(values[:, :count], selected.float().expand(len(offsets), count))
            assert (values[:, count:] == float("-inf")).all()


def test_gradient_reaches_the_selected_columns():
    x = torch.randn(3, 40, dtype=torch.float64, requires_grad=True)
    end = torch.tensor([40, 5, 0], dtype=torch.int32)
    offset = torch.tensor([7, -3, 2], dtype=torch.int32)
    values, indices = topk_select(x, 8, end, offset, sorted=True)
    weights = torch.randn(3, 8, dtype=torch.float64)
    (values.nan_to_num(neginf=0) * weights).sum().backward()
    expected = torch.zeros_like(x)
    for i, n in enumerate(end.tolist()):
        for s in range(min(n, 8)):
            expected[i, int(indices[i, s]) - int(offset[i])] += weights[i, s]
    assert torch.equal(x.grad, expected)
