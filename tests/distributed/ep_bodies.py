"""The ep family's multi-rank checks (DeepEP's own validation strategies, specs/deepep_api.md §8, §11.6), run on
each rank of spawned gloo processes by tests/ep/test_ep_ranks.py, and the emulated CUDA-graph capture check.

Multi-rank references are built from ``all_gather`` of every rank's inputs: the expected receive rows of
this rank are every source rank's tokens that selected one of its experts, source-rank-major, ascending
token; the expected combine adds biases, then each destination rank's copy in ascending rank order, in FP32.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
import traceback

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from tests.capture_emulation import capturing_everywhere
from tests.ep.specs import random_routing
from torch_ascend_moe.testing import calc_diff

# ---- what CUDA-graph capture forbids, checked on CPU ----

_aten = torch.ops.aten
# Ops whose result size or value has to be read on the host: each is a device -> host sync on CUDA / NPU.
_SYNC_OPS = {
    _aten._local_scalar_dense.default,  # item(), bool(t), int(t), float(t)
    _aten.is_nonzero.default,
    _aten.equal.default,
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten._unique2.default,
    _aten.unique_consecutive.default,
    _aten.unique_dim.default,
}
_BOOL_INDEXED = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default, _aten._index_put_impl_.default}


class _HostSyncDetector(TorchDispatchMode):
    """Records every op that reads device data on the host (the ops above, boolean-mask indexing, and
    repeat_interleave with tensor repeats and no output size)."""

    def __init__(self):
        super().__init__()
        self.syncs: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (
            func in _SYNC_OPS
            or (func in _BOOL_INDEXED and any(i is not None and i.dtype == torch.bool for i in args[1]))
            or (func is _aten.repeat_interleave.Tensor and kwargs.get("output_size") is None)
        ):
            self.syncs.append(str(func))
        return func(*args, **kwargs)


@contextlib.contextmanager
def emulated_capture():
    """Run the ep kernels as they run while a CUDA graph is being captured (``distributed.capture`` answers True), and
    fail on any host sync they make: the ops above, or ``Tensor.tolist()`` (which bypasses dispatch). This is
    the property that makes the static ops capturable; the capture itself needs a GPU (tools/device_check.sh)."""
    detector = _HostSyncDetector()
    saved_tolist = torch.Tensor.tolist

    def tolist(self):
        raise AssertionError("Tensor.tolist() (a host sync) while a graph is being captured")

    torch.Tensor.tolist = tolist
    try:
        with capturing_everywhere(), detector:
            yield detector
    finally:
        torch.Tensor.tolist = saved_tolist
    assert not detector.syncs, f"host syncs while capturing: {detector.syncs}"


def _expect_raises(fn, error, text: str) -> None:
    try:
        fn()
    except error as e:
        assert text in str(e), f"expected {text!r} in: {e}"
        return
    raise AssertionError(f"expected {error.__name__} with {text!r}")


class _World:
    """This rank's inputs, and every rank's (through all_gather_object) for references."""

    def __init__(self, rank, world, t, h, k, experts, dtype, seed):
        g = torch.Generator().manual_seed(seed + rank)
        self.rank, self.world, self.experts, self.local = rank, world, experts, experts // world
        self.idx = random_routing(t, k, experts, g)
        self.x = torch.randn(t, h, generator=g).to(dtype)
        if dtype == torch.float32:  # value-encodes-source: column 0 = rank, column 1 = token index
            self.x[:, 0], self.x[:, 1] = float(rank), torch.arange(t, dtype=torch.float32)
        self.w = torch.rand(t, k, generator=g, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
        everyone = [None] * world
        dist.all_gather_object(everyone, (self.x, self.idx, self.w))
        self.everyone = everyone

    def owner(self, e: int) -> int:
        return e // self.local

    def expected_rows(self):
        """(x rows, rebased topk_idx, masked weights) this rank must receive, in DeepEP's order."""
        xs, ids, ws = [], [], []
        for x, idx, w in self.everyone:
            for t in range(x.shape[0]):
                row = idx[t]
                if any(e >= 0 and self.owner(e) == self.rank for e in row.tolist()):
                    mine = (row >= 0) & (row // self.local == self.rank)
                    xs.append(x[t])
                    ids.append(torch.where(mine, row - self.rank * self.local, -1))
                    ws.append(torch.where(mine, w[t], 0))
        h, k = self.x.shape[1], self.idx.shape[1]
        if not xs:
            return self.x.new_empty(0, h), self.idx.new_empty(0, k), self.w.new_empty(0, k)
        return torch.stack(xs), torch.stack(ids), torch.stack(ws)


def _check_dispatch(world: _World, alignment: int) -> None:
    from torch_ascend_moe.ops.ep import ep_dispatch, ep_dispatch_cached, ep_dispatch_layout

    out = ep_dispatch(world.x, world.idx, world.w, num_experts=world.experts, expert_alignment=alignment)
    xs, ids, ws = world.expected_rows()
    assert torch.equal(out.recv_x, xs), "received rows differ from the all_gather reference (order or values)"
    assert torch.equal(out.recv_topk_idx, ids) and torch.equal(out.recv_topk_weights, ws)
    # Count cross-checks through all_reduce of the layout (DeepEP's test).
    per_rank, _, per_expert, _ = ep_dispatch_layout(world.idx, world.experts, world.world)
    per_rank, per_expert = per_rank.long(), per_expert.long()
    dist.all_reduce(per_rank)
    dist.all_reduce(per_expert)
    assert int(out.num_recv) == int(per_rank[world.rank]) == out.recv_x.shape[0]
    mine = per_expert.view(world.world, world.local)[world.rank]
    assert torch.equal(out.num_recv_tokens_per_expert.long(), (mine + alignment - 1) // alignment * alignment)
    # Cached dispatch replays the routing with new data.
    new = world.x * 3 + 1
    again, _ = ep_dispatch_cached(new, out.handle)
    assert torch.equal(again, ep_dispatch(new, world.idx, num_experts=world.experts).recv_x)


def _check_static(world: _World, t_max: int) -> None:
    from torch_ascend_moe.ops.ep import ep_dispatch

    pad = t_max - world.x.shape[0]
    x = torch.cat([world.x, world.x.new_zeros(pad, world.x.shape[1])])
    idx = torch.cat([world.idx, world.idx.new_full((pad, world.idx.shape[1]), -1)])
    w = torch.cat([world.w, world.w.new_zeros(pad, world.w.shape[1])])
    compact = ep_dispatch(x, idx, w, num_experts=world.experts)
    worst = t_max * world.world
    static = ep_dispatch(x, idx, w, num_experts=world.experts, num_worst_tokens=worst)
    n = int(static.num_recv)
    assert static.recv_x.shape[0] == worst and n == compact.recv_x.shape[0]
    assert torch.equal(static.recv_x[:n], compact.recv_x) and torch.equal(
        static.recv_topk_idx[:n], compact.recv_topk_idx
    )
    assert (static.recv_topk_idx[n:] == -1).all() and (static.recv_x[n:] == 0).all()
    assert torch.equal(static.num_recv_tokens_per_expert, compact.num_recv_tokens_per_expert)
    y = static.recv_x * 2
    from torch_ascend_moe.ops.ep import ep_combine

    a, _ = ep_combine(y, static.handle)
    b, _ = ep_combine(compact.recv_x * 2, compact.handle)
    assert torch.equal(a, b), "static and compact combines differ"
    _expect_raises(
        lambda: ep_dispatch(x, idx, w, num_experts=world.experts, num_worst_tokens=1),
        ValueError,
        "argument 'num_worst_tokens' value: expected at least the rows every rank receives",
    )


def _check_static_uneven(world: _World, worst: int) -> None:
    """A static (num_worst_tokens) dispatch with each rank's own token count, as DeepEP allows: the first
    num_recv rows bitwise the compact dispatch's, and its combine and cached dispatch the same."""
    from torch_ascend_moe.ops.ep import ep_combine, ep_dispatch, ep_dispatch_cached

    compact = ep_dispatch(world.x, world.idx, world.w, num_experts=world.experts)
    static = ep_dispatch(world.x, world.idx, world.w, num_experts=world.experts, num_worst_tokens=worst)
    n = int(static.num_recv)
    assert static.recv_x.shape[0] == worst and n == compact.recv_x.shape[0]
    assert torch.equal(static.recv_x[:n], compact.recv_x)
    assert torch.equal(static.recv_topk_idx[:n], compact.recv_topk_idx)
    assert torch.equal(static.recv_topk_weights[:n], compact.recv_topk_weights)
    assert (static.recv_topk_idx[n:] == -1).all() and (static.recv_x[n:] == 0).all()
    assert torch.equal(static.num_recv_tokens_per_expert, compact.num_recv_tokens_per_expert)
    a, wa = ep_combine(static.recv_x * 2, static.handle, static.recv_topk_weights)
    b, wb = ep_combine(compact.recv_x * 2, compact.handle, compact.recv_topk_weights)
    assert torch.equal(a, b) and torch.equal(wa, wb), "uneven static and compact combines differ"
    again, _ = ep_dispatch_cached(world.x * 3, static.handle)
    assert torch.equal(again[:n], ep_dispatch_cached(world.x * 3, compact.handle)[0]) and (again[n:] == 0).all()


def _check_capturable(world: _World, t_max: int) -> None:
    """The static ops (static dispatch, combine and cached dispatch of its handle, low-latency dispatch and
    combine) make no host sync when capturing, and give bitwise the results of the normal path."""
    from torch_ascend_moe.ops.ep import (
        ep_combine,
        ep_dispatch,
        ep_dispatch_cached,
        ep_low_latency_combine,
        ep_low_latency_dispatch,
    )

    pad = t_max - world.x.shape[0]
    x = torch.cat([world.x, world.x.new_zeros(pad, world.x.shape[1])])
    idx = torch.cat([world.idx, world.idx.new_full((pad, world.idx.shape[1]), -1)])
    w = torch.cat([world.w, world.w.new_zeros(pad, world.w.shape[1])])
    worst = t_max * world.world

    def run():
        out = ep_dispatch(x, idx, w, num_experts=world.experts, num_worst_tokens=worst)
        combined, weights = ep_combine(out.recv_x * 2, out.handle, out.recv_topk_weights)
        again, _ = ep_dispatch_cached(x * 3, out.handle)
        recv, count, handle = ep_low_latency_dispatch(x.bfloat16(), idx, t_max, world.experts, use_fp8=False)
        back = ep_low_latency_combine(recv * 2, idx, w, handle)
        return (*out[:6], combined, weights, again, recv, count, handle.src_info, handle.layout_range, back)

    normal = run()
    with emulated_capture():
        captured = run()
    for i, (a, b) in enumerate(zip(normal, captured)):
        if a is None or b is None:  # absent optionals
            assert a is b, f"output {i}"
            continue
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), f"output {i} differs when capturing"


def _check_rejections(world: _World) -> None:
    """Bad arguments on one rank and different ops on different ranks: every rank raises at once."""
    from torch_ascend_moe.ops.ep import ep_dispatch, ep_dispatch_cached, ep_low_latency_combine, ep_low_latency_dispatch

    last = world.world - 1
    start = time.monotonic()
    if world.rank == last:  # x and topk_idx disagree on T here only: a local check fails
        _expect_raises(
            lambda: ep_dispatch(world.x[:2], world.idx[:3], num_experts=world.experts, timeout_s=60.0),
            ValueError,
            "argument 'topk_idx' size(0)",
        )
    else:
        _expect_raises(
            lambda: ep_dispatch(world.x[:3], world.idx[:3], num_experts=world.experts, timeout_s=60.0),
            ValueError,
            f"rank(s) [{last}] rejected their arguments",
        )
    assert time.monotonic() - start < 30, "the other ranks waited for the timeout instead of being told"
    if world.rank == 0:
        call = lambda: ep_dispatch(world.x, world.idx, num_experts=world.experts)  # noqa: E731
    else:
        call = lambda: ep_low_latency_dispatch(world.x, world.idx, 8, world.experts, use_fp8=False)  # noqa: E731
    _expect_raises(call, ValueError, "the ranks called different ops")
    # A cached dispatch whose x lacks rows the handle sends, on one rank: every rank is told in the header (the
    # short rank failed alone after it, and a peer could return wrong rows once the short rank went on).
    out = ep_dispatch(world.x, world.idx, num_experts=world.experts)
    x = world.x[:1] if world.rank == last else world.x
    _expect_raises(
        lambda: ep_dispatch_cached(x, out.handle), ValueError, "argument 'x' size(0): expected the tokens of the"
    )
    _expect_raises(lambda: ep_dispatch_cached(x, out.handle), ValueError, f"fewer rows on rank(s) [{last}]")
    assert torch.equal(ep_dispatch_cached(world.x, out.handle)[0], out.recv_x)  # the group goes on
    # A rank that raises after the header, before the rows' barrier (here a failure injected while it writes its
    # rows): its next op's header meets its peers at the rows' barrier, and every rank raises at once instead of
    # the peers reading rows never written. Then the group goes on. (Shared memory's barriers; gloo's sockets
    # match a send to its receive by tag instead.)
    from torch_ascend_moe.distributed import shared_rows, transport

    shared = transport.control_of("test", dist.group.WORLD, 30.0) is not None
    dispatch = lambda: ep_dispatch(world.x, world.idx, num_experts=world.experts, timeout_s=5.0)  # noqa: E731
    if shared:
        if world.rank == last:

            def broken(*args, **kwargs):
                raise RuntimeError("injected failure")

            real, shared_rows.gather_rows = shared_rows.gather_rows, broken
            try:
                _expect_raises(dispatch, RuntimeError, "injected failure")
            finally:
                shared_rows.gather_rows = real
            _expect_raises(dispatch, RuntimeError, "the header exchange: rank 0 arrived at the all-to-all")
        else:
            _expect_raises(dispatch, RuntimeError, f"the all-to-all: rank {last} arrived at the header exchange")
        assert torch.equal(dispatch().recv_x, out.recv_x)
    # A low-latency combine with an id past the experts (or below -1) on one rank: every rank raises, as the
    # dispatch does, instead of an IndexError on that rank alone.
    recv, _, handle = ep_low_latency_dispatch(world.x, world.idx, 8, world.experts, use_fp8=False)
    for bad in (world.experts, -2):
        idx = world.idx.clone()
        if world.rank == last:
            idx[0, 0] = bad
        _expect_raises(
            lambda idx=idx: ep_low_latency_combine(recv, idx, world.w.float(), handle),
            ValueError,
            f"argument 'topk_idx' values: expected expert ids in [-1, {world.experts}) on every rank, got ids out "
            f"of range on rank(s) [{last}]",
        )


def _check_combine(world: _World, num_biases: int) -> None:
    from torch_ascend_moe.ops.ep import ep_combine, ep_dispatch

    out = ep_dispatch(world.x, world.idx, world.w, num_experts=world.experts)
    y = out.recv_x * (world.rank + 1)  # rank-dependent "expert" output, in the rows' dtype
    g = torch.Generator().manual_seed(world.rank)
    t, h = world.x.shape
    biases = tuple(torch.randn(t, h, generator=g).to(world.x.dtype) for _ in range(num_biases))
    combined, weights = ep_combine(y, out.handle, out.recv_topk_weights, bias=biases or None)
    acc_t = torch.float64 if world.x.dtype == torch.float64 else torch.float32
    expected = torch.zeros(t, h, dtype=acc_t)
    for b in biases:
        expected += b.to(acc_t)
    for i in range(t):  # ranks the token went to, ascending, each adding its copy (as that rank computed it)
        for r in sorted({world.owner(e) for e in world.idx[i].tolist() if e >= 0}):
            expected[i] += (world.x[i] * (r + 1)).to(acc_t)
    assert torch.equal(combined, expected.to(world.x.dtype)), "combine is not the bitwise FP32 sum in rank order"
    assert torch.equal(weights, torch.where(world.idx >= 0, world.w, 0)), "combined weights != original weights"


def _check_gradients(rank: int, world_size: int) -> None:
    """dispatch -> per-expert linear weighted by the router -> combine, against one process running every expert."""
    from torch_ascend_moe.ops.ep import ep_combine, ep_dispatch

    world = _World(rank, world_size, 5 + rank, 8, 2, 2 * world_size, torch.float64, seed=40)
    experts = torch.randn(world.experts, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    experts.requires_grad_()
    c = torch.randn(world.x.shape, generator=torch.Generator().manual_seed(50 + rank), dtype=torch.float64)
    x, w = world.x.clone().requires_grad_(), world.w.clone().requires_grad_()
    out = ep_dispatch(x, world.idx, w, num_experts=world.experts)
    y = torch.zeros_like(out.recv_x)
    for kk in range(out.recv_topk_idx.shape[1]):
        e = out.recv_topk_idx[:, kk]
        ok = (e >= 0).unsqueeze(1)
        wexp = experts[(rank * world.local + e.clamp(min=0))]
        y = y + torch.where(
            ok, out.recv_topk_weights[:, kk : kk + 1] * torch.bmm(out.recv_x.unsqueeze(1), wexp).squeeze(1), 0
        )
    combined, _ = ep_combine(y, out.handle)
    (combined * c).sum().backward()
    grad_experts = experts.grad.clone()
    dist.all_reduce(grad_experts)
    # Reference: every rank's tokens through every expert in one process.
    ref_experts = experts.detach().clone().requires_grad_()
    everyone_c = [None] * world_size
    dist.all_gather_object(everyone_c, c)
    loss, leaves = 0, []
    for (xs, ids, ws), cs in zip(world.everyone, everyone_c):
        xs, ws = xs.clone().requires_grad_(), ws.clone().requires_grad_()
        leaves.append((xs, ws))
        out_s = torch.zeros_like(xs)
        for kk in range(ids.shape[1]):
            ok = (ids[:, kk] >= 0).unsqueeze(1)
            wexp = ref_experts[ids[:, kk].clamp(min=0)]
            out_s = out_s + torch.where(ok, ws[:, kk : kk + 1] * torch.bmm(xs.unsqueeze(1), wexp).squeeze(1), 0)
        loss = loss + (out_s * cs).sum()
    loss.backward()
    ref_x, ref_w = leaves[rank]
    assert calc_diff(x.grad, ref_x.grad) < 1e-12, "x gradient"
    assert calc_diff(w.grad, ref_w.grad) < 1e-12, "weights gradient"
    assert calc_diff(grad_experts, ref_experts.grad) < 1e-12, "expert gradient"


def _check_compile(rank: int, world_size: int) -> None:
    """layout -> dispatch -> local compute -> combine under torch.compile(fullgraph=True), forward and backward."""
    from torch_ascend_moe.ops.ep import ep_combine, ep_dispatch, ep_dispatch_layout, group_name_of

    world = _World(rank, world_size, 6, 8, 2, 2 * world_size, torch.float32, seed=60)
    scale = torch.randn(8, generator=torch.Generator().manual_seed(2))
    name = group_name_of()

    def step(x, w, scale):
        per_rank, _, per_expert, _ = ep_dispatch_layout(world.idx, world.experts, world_size)
        out = ep_dispatch(x, world.idx, w, num_experts=world.experts, group=name, num_worst_tokens=6 * world_size)
        y = out.recv_x * scale * out.recv_topk_weights.sum(1, keepdim=True)
        combined, _ = ep_combine(y, out.handle)
        return combined.square().sum() + per_rank.sum() * 0 + per_expert.sum() * 0

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    args = [world.x.clone().requires_grad_(), world.w.clone().requires_grad_(), scale.clone().requires_grad_()]
    eager_loss = step(*args)
    eager_grads = torch.autograd.grad(eager_loss, args)
    loss = compiled(*args)
    grads = torch.autograd.grad(loss, args)
    torch.testing.assert_close(loss, eager_loss)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b)


def _check_low_latency(rank: int, world_size: int) -> None:
    """DeepEP's low-latency test, scaled down: per-expert rows, counts, source segments, identity-expert combine."""
    from torch_ascend_moe.ops.ep import ep_dispatch_layout, ep_low_latency_combine, ep_low_latency_dispatch

    t_max, h = 8, 512
    world = _World(rank, world_size, 5 + rank % 3, h, 3, 2 * world_size, torch.bfloat16, seed=70)
    for xs in [world.x] + [xs for xs, _, _ in world.everyone]:  # last 128 channels = token index, as DeepEP's test
        xs[:, -128:] = torch.arange(xs.shape[0], dtype=torch.bfloat16).unsqueeze(1)
    _, _, per_expert, _ = ep_dispatch_layout(world.idx, world.experts, world_size)
    per_expert = per_expert.long()
    dist.all_reduce(per_expert)
    mine = per_expert.view(world_size, world.local)[rank]
    everyone_x = [xs for xs, _, _ in world.everyone]
    for use_fp8, round_scale, ue8m0 in (
        (False, False, False),
        (True, False, False),
        (True, True, False),
        (True, True, True),
    ):
        recv, count, handle = ep_low_latency_dispatch(
            world.x, world.idx, t_max, world.experts, use_fp8=use_fp8, round_scale=round_scale, use_ue8m0=ue8m0
        )
        assert torch.equal(count.long(), mine), "recv_count != all_reduce of the layout's per-expert counts"
        if use_fp8:
            data, scales = recv
            if ue8m0:
                scales = (scales.contiguous().view(torch.uint8).int() << 23).view(torch.float32)
            values = data.float() * scales.repeat_interleave(128, dim=-1)[..., :h]
        else:
            values = recv.float()
        for i in range(world.local):
            e = rank * world.local + i
            expected = [
                (s, t)
                for s, (_, idx, _) in enumerate(world.everyone)
                for t in range(idx.shape[0])
                if e in idx[t].tolist()
            ]
            c = len(expected)
            assert int(count[i]) == c
            assert handle.src_info[i, :c].tolist() == [t for _, t in expected] and (handle.src_info[i, c:] == -1).all()
            ranges = handle.layout_range[i].tolist()
            for s in range(world_size):
                begin, n = ranges[s] >> 32, ranges[s] & 0xFFFFFFFF
                assert n == sum(1 for src, _ in expected if src == s) and begin == sum(
                    1 for src, _ in expected if src < s
                )
            ref = torch.stack([everyone_x[s_][t].float() for s_, t in expected]) if c else values[i, :0]
            if use_fp8:
                assert calc_diff(values[i, :c], ref) < 1e-3
            else:
                assert torch.equal(values[i, :c], ref)
        # Identity experts: combined = x * sum of the valid weights (DeepEP's check).
        y = values.to(torch.bfloat16)
        combined = ep_low_latency_combine(y, world.idx, world.w, handle)
        expected = world.x.float() * torch.where(world.idx >= 0, world.w, 0).sum(1, keepdim=True)
        assert calc_diff(combined.float(), expected) < (9e-4 if use_fp8 else 1e-5)
        assert not combined.isnan().any()
    # Gradients (FP64): dispatch -> per-expert scaling -> weighted combine, against the closed form.
    world = _World(rank, world_size, 4, 8, 2, 2 * world_size, torch.float64, seed=80)
    x, w = world.x.clone().requires_grad_(), world.w.clone().requires_grad_()
    scale = torch.arange(1, world.experts + 1, dtype=torch.float64)
    recv, _, handle = ep_low_latency_dispatch(x, world.idx, 4, world.experts, use_fp8=False)
    local_scale = scale[rank * world.local : (rank + 1) * world.local].view(-1, 1, 1)
    out = ep_low_latency_combine(recv * local_scale, world.idx, w, handle)
    c = torch.randn(out.shape, generator=torch.Generator().manual_seed(rank), dtype=torch.float64)
    (out * c).sum().backward()
    idx = world.idx
    s_k = torch.where(idx >= 0, scale[idx.clamp(min=0)], 0)  # [T, K]
    valid_w = torch.where(idx >= 0, world.w, 0)
    ref_gx = c * (valid_w * s_k).sum(1, keepdim=True)
    ref_gw = torch.where(idx >= 0, (c * world.x).sum(1, keepdim=True) * s_k, 0)
    assert calc_diff(x.grad, ref_gx) < 1e-12 and calc_diff(w.grad, ref_gw) < 1e-12, "low-latency gradients"


def _check_deep_ep_buffer(rank: int, world_size: int) -> None:
    """DeepEP-style code through ``torch_ascend_moe.deep_ep``: layout -> dispatch -> combine, and low latency."""
    import torch_ascend_moe.deep_ep as deep_ep
    from torch_ascend_moe.ops.ep import ep_dispatch

    buffer = deep_ep.Buffer(dist.group.WORLD, int(2e9), 0, low_latency_mode=True)
    world = _World(rank, world_size, 6, 16, 2, 2 * world_size, torch.bfloat16, seed=90)
    per_rank, per_rdma, per_expert, in_rank, event = buffer.get_dispatch_layout(world.idx, world.experts)
    assert per_rdma is None and isinstance(event, deep_ep.EventOverlap)
    recv_x, recv_idx, recv_w, counts, handle, event = buffer.dispatch(
        world.x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=world.idx,
        topk_weights=world.w,
        expert_alignment=4,
    )
    event.current_stream_wait()
    direct = ep_dispatch(world.x, world.idx, world.w, num_experts=world.experts, expert_alignment=4)
    assert torch.equal(recv_x, direct.recv_x) and counts == direct.num_recv_tokens_per_expert.tolist()
    combined, combined_w, _ = buffer.combine(recv_x, handle, topk_weights=recv_w)
    copies = in_rank.sum(1, keepdim=True).to(torch.float32)
    assert calc_diff(combined.float() / copies.clamp(min=1), world.x.float() * (copies > 0)) < 5e-6
    assert torch.equal(combined_w, torch.where(world.idx >= 0, world.w, 0))
    cached, *_ = buffer.dispatch(world.x * 2, handle=handle)
    assert torch.equal(cached, ep_dispatch(world.x * 2, world.idx, num_experts=world.experts).recv_x)
    buffer.clean_low_latency_buffer(8, 16, world.experts)
    recv, count, ll_handle, _, hook = buffer.low_latency_dispatch(
        world.x, world.idx, 8, world.experts, use_fp8=False, return_recv_hook=True
    )
    hook()
    combined, _, _ = buffer.low_latency_combine(recv, world.idx, world.w, ll_handle)
    expected = world.x.float() * torch.where(world.idx >= 0, world.w, 0).sum(1, keepdim=True)
    assert calc_diff(combined.float(), expected) < 1e-5


def rank_checks(rank: int, world_size: int, store_path: str) -> None:
    """Everything a multi-rank run checks; raises on the first failure (mp.spawn reports it)."""
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
    )
    import torch_ascend_moe  # noqa: F401
    from torch_ascend_moe.ops.ep import ep_dispatch

    try:
        t_of = [6 + 3 * r for r in range(world_size)]  # uneven token counts
        for dtype in (torch.float32, torch.bfloat16):
            world = _World(rank, world_size, t_of[rank], 16, 3, 4 * world_size, dtype, seed=10)
            for alignment in (1, 128):
                _check_dispatch(world, alignment)
            for biases in (0, 1, 2):
                _check_combine(world, biases)
            _check_static(world, max(t_of))
            _check_static_uneven(world, sum(t_of))
            _check_capturable(world, max(t_of))
        # FP8 rows with their scales move bitwise.
        world = _World(rank, world_size, t_of[rank], 128, 2, 2 * world_size, torch.float32, seed=20)
        x8, sf = world.x.to(torch.float8_e4m3fn), torch.rand(world.x.shape[0], 1) + 0.5
        out = ep_dispatch(world.x, world.idx, num_experts=world.experts)
        out8 = ep_dispatch(x8, world.idx, num_experts=world.experts, x_scales=sf)
        assert torch.equal(out8.recv_x.view(torch.uint8), out.recv_x.to(torch.float8_e4m3fn).view(torch.uint8))
        everyone_sf = [None] * world_size
        dist.all_gather_object(everyone_sf, sf)
        expected_sf = [
            everyone_sf[s][t]
            for s, (x, idx, _) in enumerate(world.everyone)
            for t in range(x.shape[0])
            if any(e >= 0 and world.owner(e) == rank for e in idx[t].tolist())
        ]
        assert torch.equal(out8.recv_x_scales, torch.stack(expected_sf) if expected_sf else sf[:0])
        _check_gradients(rank, world_size)
        if world_size == 2:  # the compiled graph is the same program on more ranks: one cold compile per rank
            _check_compile(rank, world_size)
        _check_low_latency(rank, world_size)
        _check_deep_ep_buffer(rank, world_size)
        # A bad expert id on one rank: every rank raises (nobody hangs).
        world = _World(rank, world_size, 4, 8, 2, 2 * world_size, torch.float32, seed=30)
        idx = world.idx.clone()
        if rank == world_size - 1:
            idx[0, 0] = world.experts
        _expect_raises(
            lambda: ep_dispatch(world.x, idx, num_experts=world.experts),
            ValueError,
            "argument 'topk_idx' values: expected expert ids in [-1",
        )
        _check_rejections(world)
        # Shapes that disagree across ranks: reported, not hung.
        h = 8 if rank == 0 else 16
        _expect_raises(
            lambda: ep_dispatch(torch.randn(3, h), world.idx[:3], num_experts=world.experts),
            ValueError,
            "the ranks disagree on x's row bytes",
        )
        dist.barrier()
        # A rank that never arrives: the others get an error within the timeout.
        if rank == 0:
            _expect_raises(
                lambda: ep_dispatch(world.x, world.idx, num_experts=world.experts, timeout_s=2.0),
                RuntimeError,
                "did not complete within 2 s",
            )
    except BaseException:
        traceback.print_exc()
        os._exit(1)  # a broken group can hang interpreter shutdown; the traceback above says what failed
    if rank != 0:
        time.sleep(3)  # outlive rank 0's timeout check
    os._exit(0)
