"""What DeepSelect's own test accepts of a top-k result (specs/tilekernels_deepselect.md §11.3), vectorized: any
valid set (ties arbitrary), so it judges every path of the op and the compat package alike.

Per row with ``n = end[i]`` valid columns and ``c = min(n, topk)`` kept slots: a row holding NaN in its range has
every index ``0x3F3F3F3F`` (and NaN values); otherwise the kept indices minus the offset are distinct columns in
``[0, n)``, each value is bitwise ``input[row, column]``, no unselected value in range exceeds the smallest
selected one, the fills sit bitwise in the other slots, and the requested order holds.
"""

from __future__ import annotations

import torch

NAN_MARKER = 0x3F3F3F3F
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(_BITS[t.element_size()])


def check_topk(
    x: torch.Tensor,
    topk: int,
    values: torch.Tensor | None,
    indices: torch.Tensor,
    *,
    end: torch.Tensor | None = None,
    offset: torch.Tensor | None = None,
    idx_fill: int = 2147483647,
    value_fill: float = float("-inf"),
    sorted_values: bool = False,
    sorted_index: bool = False,
) -> None:
    """Raise AssertionError naming the first broken rule."""
    b, V = x.shape
    assert tuple(indices.shape) == (b, topk), f"indices shape {tuple(indices.shape)}"
    n = torch.full((b,), V) if end is None else end.long()
    count = torch.clamp(n, max=topk)
    kept = torch.arange(topk) < count[:, None]
    in_range = torch.arange(V) < n[:, None]
    nan_row = (x.isnan() & in_range).any(1)
    assert (indices[nan_row] == NAN_MARKER).all(), "NaN rows: every index must be 0x3F3F3F3F"
    if values is not None:
        assert values.dtype == x.dtype and tuple(values.shape) == (b, topk), "values dtype/shape"
        assert values[nan_row].isnan().all(), "NaN rows: values must be NaN"
    ok = ~nan_row
    x, n, kept, in_range, indices = x[ok], n[ok], kept[ok], in_range[ok], indices[ok].long()
    if offset is not None:
        indices = torch.where(kept, indices - offset[ok].long()[:, None], indices)
    assert ((indices >= 0) & (indices < n[:, None]) | ~kept).all(), "a kept index is outside [0, end)"
    assert (indices[~kept] == idx_fill).all(), "padding indices must be idx_oob_fill_value (not offset)"
    safe = torch.where(kept, indices, 0)
    ranked = torch.sort(torch.where(kept, safe, V + torch.arange(topk)), dim=1).values
    assert (ranked[:, 1:] != ranked[:, :-1]).all(), "duplicate indices"
    gathered = x.gather(1, safe) if V else x.new_zeros(safe.shape)  # V = 0: no slot is kept
    if values is not None:
        values = values[ok]
        assert torch.equal(_bits(values)[kept], _bits(gathered)[kept]), "a value is not input[row, index]"
        fill = torch.tensor(value_fill, dtype=torch.float64).to(x.dtype)
        assert torch.equal(_bits(values)[~kept], _bits(fill.expand(int((~kept).sum())))), "padding values"
    if V == 0:  # nothing is kept: the padding checks above are all there is
        return
    low = torch.where(kept, gathered.double(), float("inf")).amin(1)
    rest = torch.where(in_range, x.double(), float("-inf")).scatter(1, safe, float("-inf"))
    has_rest = (kept.sum(1) > 0) & (kept.sum(1) < n)
    if has_rest.any():
        assert (low >= rest.amax(1))[has_rest].all(), "an unselected value is larger than a selected one"
    pairs = kept[:, 1:]
    if sorted_index:
        assert ((indices[:, 1:] >= indices[:, :-1]) | ~pairs).all(), "indices are not ascending"
    if sorted_values:
        assert ((gathered[:, :-1] >= gathered[:, 1:]) | ~pairs).all(), "values are not descending"
