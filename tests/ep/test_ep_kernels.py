"""The ep family's CPU helper kernel (ascend_moe_kernels::ep_combine_reduce) against the tensor-op path the
CUDA / NPU backends take: bitwise equal, in the combine's fixed order."""

import pytest
import torch

from torch_ascend_moe.backends.portable import ep as kernels


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
    portable = kernels._reduce_rows_portable(rows, dest, tokens, *bias, ranks)
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
    portable_visit = kernels._reduce_rows([rows], dest, tokens, *bias, ranks, visit)
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
    """exchange.new_rows (the receive buffers and gathered rows of the ep kernels): a block of 32 MiB or more
    reuses an earlier block's memory only once no tensor or view references it; smaller blocks and fake tensors
    are plain new_empty."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torch_ascend_moe.distributed.exchange import new_rows

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
    with FakeTensorMode() as mode:
        fake = new_rows(mode.from_tensor(like), rows, h)
    assert fake.shape == (rows, h)
