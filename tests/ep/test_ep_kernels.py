"""The ep family's CPU helper kernels (ascend_moe_kernels::ep_combine_reduce, ep_dispatch_plan,
ep_dispatch_unpack) against the tensor-op paths the CUDA / NPU backends take: bitwise equal (the combine in its
fixed order)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torch_ascend_moe.backends.portable.ep.combine import _reduce_rows, _reduce_rows_portable
from torch_ascend_moe.backends.portable.ep.dispatch import _send_plan, _send_plan_portable, _unpack, _unpack_portable
from torch_ascend_moe.distributed import payload


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("biases", [0, 1, 2])
def test_combine_reduce_matches_portable_path(dtype, biases):
    g = torch.Generator().manual_seed(biases)
    ranks, tokens, h = 4, 37, 96
    # Each rank's segment holds each token at most once, ascending, with -1 padding rows (a static handle).
    segments = []
    for _ in range(ranks):
        picked = torch.nonzero(torch.rand(tokens, generator=g) < 0.6).view(-1)
        segments += [picked, torch.full((3,), -1)]
    dest = torch.cat(segments)
    # Wide-range values make the FP32 sum order-sensitive: a different order would change bits.
    rows = (torch.randn(dest.shape[0], h + 8, generator=g) * torch.logspace(-3, 3, h + 8)).to(dtype)[:, :h]
    bias = [torch.randn(tokens, h, generator=g).to(torch.bfloat16) for _ in range(biases)]
    bias += [None] * (2 - biases)
    ours = torch.ops.ascend_moe_kernels.ep_combine_reduce([rows], dest, tokens, *bias)
    portable = _reduce_rows_portable(rows, dest, tokens, *bias, ranks)
    # Rows in blocks (the shared-memory transport's: own rows and each peer's where they lie, any row strides).
    cuts = sorted(torch.randint(0, rows.shape[0] + 1, (3,), generator=g).tolist())
    blocks = [rows[a:b] for a, b in zip([0, *cuts], [*cuts, rows.shape[0]])]
    blocks[1] = torch.cat([blocks[1], blocks[1]], 1)[:, :h]  # a row stride of 2h
    blocked = torch.ops.ascend_moe_kernels.ep_combine_reduce(blocks, dest, tokens, *bias)
    assert torch.equal(blocked.view(torch.uint8), ours.view(torch.uint8))
    # A visiting order (ElasticBuffer's slot order): the same as the rows permuted into that order.
    visit = torch.randperm(rows.shape[0], generator=g)
    visited = torch.ops.ascend_moe_kernels.ep_combine_reduce(blocks, dest, tokens, *bias, visit)
    permuted = torch.ops.ascend_moe_kernels.ep_combine_reduce([rows[visit]], dest[visit], tokens, *bias)
    assert torch.equal(visited.view(torch.uint8), permuted.view(torch.uint8))
    into = torch.empty(tokens, h, dtype=dtype)
    written = torch.ops.ascend_moe_kernels.ep_combine_reduce.out(blocks, dest, tokens, *bias, visit, out=into)
    assert written is into and torch.equal(into.view(torch.uint8), visited.view(torch.uint8))
    portable_visit = _reduce_rows([rows], dest, tokens, *bias, ranks, visit)
    assert torch.equal(portable_visit.view(torch.uint8), visited.view(torch.uint8))
    assert ours.dtype == dtype and ours.shape == (tokens, h)
    assert torch.equal(ours.view(torch.uint8), portable.view(torch.uint8))
    # And the order is the row order: FP64 of the same sums in that order, rounded through FP32.
    acc_t = torch.float64 if dtype == torch.float64 else torch.float32
    ref = torch.zeros(tokens, h, dtype=acc_t)
    for b in bias:
        if b is not None:
            ref += b.to(acc_t)
    for i, t in enumerate(dest.tolist()):
        if t >= 0:
            ref[t] += rows[i].to(acc_t)
    assert torch.equal(ours, ref.to(dtype))


def test_combine_reduce_bad_dest():
    rows = torch.randn(4, 8)
    with pytest.raises(
        ValueError, match=r"ep_combine_reduce: argument 'dest' values: expected token indices in \[-1, 3\), got 5"
    ):
        torch.ops.ascend_moe_kernels.ep_combine_reduce([rows], torch.tensor([0, 1, 5, -1]), 3)
    with pytest.raises(ValueError, match=r"ep_combine_reduce: argument 'dest' size\(0\): expected 6, got 4"):
        torch.ops.ascend_moe_kernels.ep_combine_reduce([rows, rows[:2]], torch.tensor([0, 1, 2, -1]), 3)
    with pytest.raises(ValueError, match=r"ep_combine_reduce: argument 'visit' values: expected row indices in"):
        torch.ops.ascend_moe_kernels.ep_combine_reduce(
            [rows], torch.tensor([0, 1, 2, -1]), 3, None, None, torch.arange(1, 5)
        )
    with pytest.raises(ValueError, match=r"ep_combine_reduce: argument 'out' shape: expected contiguous \[3, 8\], got"):
        torch.ops.ascend_moe_kernels.ep_combine_reduce.out(
            [rows], torch.tensor([0, 1, 2, -1]), 3, out=torch.empty(2, 8)
        )
    with pytest.raises(ValueError, match=r"ep_combine_reduce: argument 'rows' dtype: expected torch.float32, got"):
        torch.ops.ascend_moe_kernels.ep_combine_reduce([rows, rows.double()], torch.zeros(8, dtype=torch.long), 3)


def test_emulated_capture_catches_host_syncs():
    """The capture check (tests.distributed.ep_bodies.emulated_capture) can fail: boolean masks, item() and
    tolist() are caught; a compact dispatch (data-dependent size) refuses to run while capturing."""
    from tests.distributed.ep_bodies import emulated_capture
    from tests.ep.specs import init_single_rank_group
    from torch_ascend_moe.ops.ep import ep_dispatch

    init_single_rank_group()
    idx = torch.tensor([[0, 1], [1, -1]])
    with pytest.raises(ValueError, match="argument 'num_worst_tokens' value: expected a positive static row count"):
        with emulated_capture():
            ep_dispatch(torch.randn(2, 8), idx, num_experts=2)
    for action in (
        lambda: torch.arange(4)[torch.arange(4) > 1],
        lambda: torch.arange(4).sum().item(),
        lambda: torch.arange(4).tolist(),
    ):
        with pytest.raises(AssertionError, match="host sync"):
            with emulated_capture():
                action()
    with emulated_capture():  # and passes what is capturable
        ep_dispatch(torch.randn(2, 8), idx, num_experts=2, num_worst_tokens=2)


def test_compact_dispatch_fake_sizes_are_bounded():
    """A compact dispatch's fake: unbacked receive / send row counts, both >= 0, the send rows <= R * T."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from tests.ep.specs import init_single_rank_group
    from torch_ascend_moe.ops.ep import ep_dispatch

    init_single_rank_group()
    shape_env = ShapeEnv()
    with FakeTensorMode(shape_env=shape_env):
        out = ep_dispatch(torch.randn(5, 8), torch.zeros(5, 2, dtype=torch.long), num_experts=2)
    recv_rows, send_rows = out.recv_x.shape[0], out.handle.send_src.shape[0]
    ranges = {str(s): r for s, r in shape_env.var_to_range.items()}
    recv_range, send_range = ranges[str(recv_rows.node.expr)], ranges[str(send_rows.node.expr)]
    assert recv_range.lower == 0 and send_range.lower == 0
    assert send_range.upper == 5  # one rank, five tokens


def test_ops_take_any_strides():
    """Transposed (non-contiguous) x, topk_idx and topk_weights give bitwise the contiguous copies' results
    (a view of a strided temporary used to raise), for dispatch, layout, low-latency dispatch and expand."""
    from tests.ep.specs import init_single_rank_group
    from torch_ascend_moe.ops.ep import ep_dispatch, ep_dispatch_layout, ep_expand, ep_low_latency_dispatch

    name = init_single_rank_group()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(128, 9, generator=g).bfloat16().t()
    idx = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(9)]).t().contiguous().t()
    w = torch.rand(3, 9, generator=g).t()
    assert not (x.is_contiguous() or idx.is_contiguous() or w.is_contiguous())
    strided = ep_dispatch(x, idx, w, num_experts=8, group=name)
    dense = ep_dispatch(x.contiguous(), idx.contiguous(), w.contiguous(), num_experts=8, group=name)
    for a, b in zip(strided[:6], dense[:6]):
        assert a is None and b is None or torch.equal(a, b)
    assert all(
        torch.equal(a, b) for a, b in zip(ep_dispatch_layout(idx, 8, 1), ep_dispatch_layout(idx.contiguous(), 8, 1))
    )
    ll = ep_low_latency_dispatch(x, idx, 9, 8, group=name, use_fp8=True)[0]
    ll_dense = ep_low_latency_dispatch(x.contiguous(), idx.contiguous(), 9, 8, group=name, use_fp8=True)[0]
    assert torch.equal(ll[0].view(torch.uint8), ll_dense[0].view(torch.uint8)) and torch.equal(ll[1], ll_dense[1])
    ex = ep_expand(x, idx, w, num_local_experts=8, expert_alignment=4)
    ex_dense = ep_expand(x.contiguous(), idx.contiguous(), w.contiguous(), num_local_experts=8, expert_alignment=4)
    assert all(torch.equal(a, b) for a, b in zip(ex, ex_dense) if a is not None)


def test_large_outputs_reuse_only_unreferenced_memory():
    """payload.new_rows (the receive buffers and gathered rows of the ep kernels): a block of 256 KiB or more
    reuses an earlier block's memory only once no tensor or view references it; smaller blocks and fake tensors
    are plain new_empty."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_ascend_moe.distributed.payload import new_rows

    like = torch.empty(1, dtype=torch.bfloat16)
    rows, h = 4096, 4096  # 32 MiB of BF16
    a = new_rows(like, rows, h)
    b = new_rows(like, rows, h)
    assert a.data_ptr() != b.data_ptr() and a.shape == (rows, h) and a.dtype == torch.bfloat16
    a_ptr = a.data_ptr()
    del a
    c = new_rows(like, rows, h)
    assert c.data_ptr() == a_ptr  # nothing referenced a: its pages are reused
    view = c[1:]
    del c
    d = new_rows(like, rows, h)
    assert d.data_ptr() not in (a_ptr, b.data_ptr())  # a view still holds c's memory, b is alive
    view.fill_(1)
    d.fill_(2)
    assert bool((view == 1).all())
    small = new_rows(like, 4, 8)
    assert small.shape == (4, 8) and small.untyped_storage().nbytes() == 64
    kept = new_rows(like, 128, 1024)  # 256 KiB: reused too (glibc's heap trims its top: fresh pages again)
    kept_ptr = kept.data_ptr()
    del kept
    assert new_rows(like, 128, 1024).data_ptr() == kept_ptr
    with FakeTensorMode() as mode:
        fake = new_rows(mode.from_tensor(like), rows, h)
    assert fake.shape == (rows, h)


@st.composite
def _routings(draw):
    """A rank's dispatch arguments: ids with -1, duplicates and out-of-range values, any strides and index
    dtype, optional scales (FP32 or packed int32, any width) and weights (with NaN and -0.0)."""
    r = draw(st.integers(1, 4))
    e = r * draw(st.integers(1, 5))
    t, k = draw(st.integers(0, 24)), draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-3, e + 3, (t, k), generator=g)
    idx[torch.rand(t, k, generator=g) < 0.6] = torch.randint(0, e, (1,), generator=g).item() if e else 0
    idx = idx.to(draw(st.sampled_from([torch.int64, torch.int32])))
    if draw(st.booleans()):  # column-major
        idx = idx.t().contiguous().t()
    scales = None
    if draw(st.booleans()):
        cols = draw(st.integers(0, 5))
        scales = torch.randn(t, cols, generator=g)
        if draw(st.booleans()):
            scales = scales.view(torch.int32)
    weights = None
    if draw(st.booleans()):
        weights = torch.randn(t, k, generator=g).to(draw(st.sampled_from([torch.float32, torch.float64])))
        if t:
            weights[0, 0], weights[-1, -1] = float("nan"), -0.0
        weights = weights.t().contiguous().t() if draw(st.booleans()) else weights
    return idx, e, r, draw(st.booleans()), scales, weights, seed


@settings(max_examples=200, deadline=None)
@given(_routings())
def test_dispatch_plan_and_unpack_match_portable_path(case):
    """The CPU helper kernels of a dispatch's send plan and receive side (ep_dispatch_plan / ep_dispatch_unpack)
    are bitwise the tensor-op path's (CUDA / NPU), on valid and bad ids, padded and compact plans."""
    idx, e, r, padded, scales, weights, seed = case
    ours = _send_plan(idx, e, r, padded, scales, weights)
    portable = _send_plan_portable(idx, e, r, padded, scales, weights)
    for a, b in zip(ours, portable):
        assert a.dtype == b.dtype and torch.equal(a, b)
    bad, counts, send_src, meta = ours
    out_of_range = (idx < -1) | (idx >= e)
    assert int(bad) == int(out_of_range.sum())
    ids = torch.where(out_of_range, -1, idx.long())
    for d in range(r):  # the plan against its definition: tokens with an expert on rank d, ascending
        on_d = [i for i in range(idx.shape[0]) if any(0 <= v // (e // r) == d for v in ids[i].tolist() if v >= 0)]
        rows = send_src.view(r, -1)[d] if padded else send_src[sum(counts[:d].tolist()) :][: len(on_d)]
        assert [v for v in rows.tolist() if v >= 0] == on_d and int(counts[d]) == len(on_d)
    # The receive side: rows from several sources (here this plan's rows, shuffled) and zeroed padding rows.
    g = torch.Generator().manual_seed(seed)
    rows = torch.cat(
        [meta[torch.randperm(meta.shape[0], generator=g)], torch.zeros(2, meta.shape[1], dtype=torch.uint8)]
    )
    scale_bytes = 0 if scales is None else payload.row_bytes(scales)
    weight_size = 0 if weights is None else weights.element_size()
    local = e // r
    for rank in range(r):
        for alignment in (1, 3):
            args = (rows, scale_bytes, idx.shape[1], weight_size, rank * local, local, alignment)
            got, want = _unpack(*args), _unpack_portable(*args)
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and torch.equal(a, b)


def test_dispatch_unpack_bad_width():
    meta = torch.zeros(3, 24, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"ep_dispatch_unpack: argument 'meta' size\(1\): expected 32, got 24"):
        torch.ops.ascend_moe_kernels.ep_dispatch_unpack(meta, 0, 2, 4, 0, 2, 1)
    with pytest.raises(ValueError, match=r"ep_dispatch_plan: argument 'num_experts' value: expected a multiple of"):
        torch.ops.ascend_moe_kernels.ep_dispatch_plan(torch.zeros(2, 1, dtype=torch.long), 3, 2, False, None, None)
