"""moe_unpermute's C++ kernel (slots summed in registers sixteen columns at a time; AVX-512, AVX2 and baseline
clones, the CPU picks one) is bit for bit the portable kernel, the slot-order sum the CUDA kernel also computes: random
shapes (column tails past the sixteen-column blocks), dtypes, -1 slots, NaN/inf in rows and weights, biases of both
dtypes, strided rows."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torch_ascend_moe  # noqa: F401
from torch_ascend_moe.backends.portable import moe_routing as portable


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num())


@settings(max_examples=60, deadline=None)
@given(
    t=st.integers(0, 40),
    k=st.integers(1, 9),
    h=st.integers(1, 80),
    dtype=st.sampled_from([torch.bfloat16, torch.float32, torch.float16, torch.float64]),
    weights=st.booleans(),
    bias=st.sampled_from([None, "same", "wide"]),
    unrouted=st.floats(0, 0.5),
    special=st.booleans(),
    strided=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_cpu_kernel_is_the_portable_kernel_bitwise(t, k, h, dtype, weights, bias, unrouted, special, strided, seed):
    g = torch.Generator().manual_seed(seed)
    rows = t * k + 3
    y = torch.randn(rows, 2 * h if strided else h, generator=g).mul(8).to(dtype)
    if strided:
        y = y[:, ::2]
    row_map = torch.randperm(rows, generator=g)[: t * k].view(t, k).to(torch.int32)
    row_map[torch.rand(t, k, generator=g) < unrouted] = -1
    w = torch.rand(t, k, generator=g).to(dtype if dtype != torch.float16 else torch.float32) if weights else None
    if special and t and rows:
        y.view(-1)[seed % y.numel()] = float("nan")
        y[seed % rows, 0] = float("inf")
        if w is not None:
            w[seed % t, seed % k] = float("nan")  # read only if that slot is routed
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    b = None
    if bias is not None:
        b = torch.randn(t, h, generator=g).to(dtype if bias == "same" else acc)
        if b.dtype == dtype and dtype != acc and t:
            b[0, 0] = -0.0
    ours = torch.ops.ascend_moe.moe_unpermute(y, row_map, w, b)
    reference = portable.moe_unpermute(y, row_map, w, b)
    assert _same(ours, reference), (ours - reference).abs().nan_to_num().max()
