"""DeepEP V1 compat checks (issue 16, specs/deepep_api.md §2.1, §4, §6), run on each rank of spawned gloo
processes by tests/ep/test_deep_ep_compat.py: one named check per spawn, the way DeepEP's own tests use
``deep_ep.Buffer``."""

from __future__ import annotations

import datetime
import os
import time
import traceback

import torch
import torch.distributed as dist

from tests.distributed import run_named
from tests.ep.specs import random_routing
from torch_ascend_moe.testing import calc_diff


def _routing(rank: int, t: int, k: int, experts: int, seed: int):
    g = torch.Generator().manual_seed(seed + rank)
    idx = random_routing(t, k, experts, g)
    x = torch.randn(t, 256, generator=g).to(torch.bfloat16)
    w = torch.rand(t, k, generator=g)
    return x, idx, w


def check_sm90_gates_fp8(rank: int, world_size: int) -> None:
    """DeepEP's intranode test only runs FP8 dispatch when ``is_sm90_compiled()``: it must, and FP8 works."""
    import torch_ascend_moe.deep_ep as deep_ep

    assert deep_ep.Buffer.is_sm90_compiled(), "is_sm90_compiled() is False: DeepEP's tests skip FP8"
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e9))
    x, idx, w = _routing(rank, 6, 2, 2 * world_size, seed=100)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, 2 * world_size)
    x8 = x.float().to(torch.float8_e4m3fn)
    sf = torch.ones(x.shape[0], x.shape[1] // 128)
    (recv8, recv_sf), *_ = buffer.dispatch(
        (x8, sf),
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    recv, *_ = buffer.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    assert torch.equal(recv8.view(torch.uint8), recv.float().to(torch.float8_e4m3fn).view(torch.uint8))
    assert recv_sf.shape == (recv.shape[0], 2)


def check_shrink_masks_ranks_that_never_arrive(rank: int, world_size: int) -> None:
    """Upstream's ``--shrink-test`` scaled down: the odd ranks "die" (never reach the low-latency calls); the others
    time out on them in the first call, mask them (``low_latency_query_mask_buffer``), receive nothing from them and
    combine ``x · Σ_k w_k`` over the slots whose expert lives on a rank still alive (no renormalisation)."""
    import torch_ascend_moe.deep_ep as deep_ep

    t, k, local = 6, 2, 2
    experts = local * world_size
    buffer = deep_ep.Buffer(
        dist.group.WORLD, 0, int(1e8), low_latency_mode=True, enable_shrink=True, num_cpu_timeout_secs=2
    )
    dead = [r for r in range(world_size) if r % 2]
    status = torch.ones(world_size, dtype=torch.int32)
    buffer.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0] * world_size, status
    if rank in dead:
        return  # "dies": the survivors must not wait for it past their timeout
    buffer.clean_low_latency_buffer(t, 256, experts)  # the first call: the survivors mask the dead ranks here
    buffer.low_latency_query_mask_buffer(status)
    assert status.tolist() == [int(r in dead) for r in range(world_size)], status
    x, idx, w = _routing(rank, t, k, experts, seed=40)
    recv, count, handle, _, hook = buffer.low_latency_dispatch(x, idx, t, experts, use_fp8=False)
    assert recv.shape == (local, world_size * t, 256) and hook is None
    want = torch.zeros(local, dtype=torch.int64)
    for src in range(world_size):
        if src in dead:
            continue
        _, src_idx, _ = _routing(src, t, k, experts, seed=40)
        for j in range(local):
            want[j] += int((src_idx == rank * local + j).any(1).sum())
    assert torch.equal(count.long(), want), (count, want)
    combined, _, _ = buffer.low_latency_combine(recv, idx, w, handle)  # identity experts
    alive_slot = (idx >= 0) & ~torch.isin(torch.where(idx >= 0, idx // local, 0), torch.tensor(dead))
    expected = x.float() * torch.where(alive_slot, w, 0).sum(1, keepdim=True)
    assert calc_diff(combined, expected) < 1e-5, calc_diff(combined, expected)
    with __import__("pytest").raises(ValueError, match="shrink mode is not enabled"):
        deep_ep.Buffer(dist.group.WORLD, 0, int(1e8), low_latency_mode=True).low_latency_clean_mask_buffer()


def check_dispatch_without_topk_counts(rank: int, world_size: int) -> None:
    """Without top-k, ``num_recv_tokens_per_expert_list`` is still DeepEP's: per local expert, summed over the
    source ranks' layouts, rounded up to ``expert_alignment`` (DeepEP's intranode check); None when cached."""
    import torch_ascend_moe.deep_ep as deep_ep

    experts = 3 * world_size
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e9))
    x, idx, w = _routing(rank, 7 + 2 * rank, 3, experts, seed=110)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    everyone = per_expert.long().clone()
    dist.all_reduce(everyone)
    mine = everyone.view(world_size, -1)[rank].tolist()
    for alignment in (1, 4):
        expected = [-(-c // alignment) * alignment for c in mine]
        recv, recv_idx, recv_w, counts, handle, _ = buffer.dispatch(
            x,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            expert_alignment=alignment,
        )
        assert recv_idx is None and recv_w is None
        assert counts == expected, f"without top-k: {counts} != {expected}"
        with_topk, _, _, counts_topk, _, _ = buffer.dispatch(
            x,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=w,
            expert_alignment=alignment,
        )
        assert counts_topk == expected and torch.equal(recv, with_topk)
        cached = buffer.dispatch(x, handle=handle)
        assert cached[3] is None and torch.equal(cached[0], recv)


def _ranges(num_tokens: int, num_channels: int) -> list[range]:
    """Upstream's ``get_channel_task_range``, written out."""
    per = -(-num_tokens // num_channels)
    return [range(min(per * c, num_tokens), min(per * c + per, num_tokens)) for c in range(num_channels)]


def reference_handle(rank: int, num_channels: int, in_rank: list[torch.Tensor], num_rows: int | None = None) -> tuple:
    """DeepEP V1's normal-mode handle fields for ``rank``, simulated token by token the way upstream's kernels
    fill them (intranode.cu / internode.cu: channels as token ranges, per-(channel, destination) queue tails),
    from every rank's ``is_token_in_rank`` (``in_rank[i]``: rank i's ``[T_i, R]``). 6 fields for R <= 8, else 10."""
    num_ranks = in_rank[0].shape[1]
    m = [[[bool(v) for v in row] for row in r.tolist()] for r in in_rank]
    rows_from = [[t for t in range(len(m[s])) if m[s][t][rank]] for s in range(num_ranks)]
    real = sum(len(r) for r in rows_from)
    num_rows = real if num_rows is None else num_rows

    def channel_prefix(mask, width, inclusive=True):  # [K][C] from mask rows [T][K]
        out = []
        for k in range(width):
            acc, row = 0, []
            for ch in _ranges(len(mask), num_channels):
                before = acc
                acc += sum(mask[t][k] for t in ch)
                row.append(acc if inclusive else before)
            out.append(row)
        return out

    def heads(mask, width):  # [T][K]: queue tail of (channel, k) when token t is sent, else -1
        out = [[-1] * width for _ in mask]
        for ch in _ranges(len(mask), num_channels):
            tail = [0] * width
            for t in ch:
                for k in range(width):
                    if mask[t][k]:
                        out[t][k], tail[k] = tail[k], tail[k] + 1
        return out

    def i32(v, *shape):
        return torch.tensor(v, dtype=torch.int32).reshape(*shape)

    mine = m[rank]
    t_mine = len(mine)
    if num_ranks <= 8:
        sent = [[sum(row[j] for row in m[i]) for j in range(num_ranks)] for i in range(num_ranks)]
        prefix = [[sum(sent[a][j] for a in range(i + 1)) for j in range(num_ranks)] for i in range(num_ranks)]
        send_prefix = channel_prefix(mine, num_ranks)
        recv_channel = [channel_prefix([[row[rank]] for row in m[s]], 1, False)[0] for s in range(num_ranks)]
        src_idx = [t for r in rows_from for t in r] + [-1] * (num_rows - real)
        return (
            i32(prefix, num_ranks, num_ranks),
            i32(send_prefix, num_ranks, num_channels),
            i32(recv_channel, num_ranks, num_channels),
            i32(src_idx, num_rows),
            in_rank[rank].clone(),
            i32(heads(mine, num_ranks), t_mine, num_ranks),
        )
    nvl, nodes, node, local = 8, num_ranks // 8, rank // 8, rank % 8
    any_node = [[[any(row[n * nvl : (n + 1) * nvl]) for n in range(nodes)] for row in r] for r in m]
    peers = [n * nvl + local for n in range(nodes)]
    recv_rdma_channel = [channel_prefix([[row[node]] for row in any_node[p]], 1)[0] for p in peers]
    got = [sum(row[node] for row in any_node[p]) for p in peers]
    recv_rdma_prefix = [sum(got[: n + 1]) for n in range(nodes)]
    send_nvl = []
    for p in peers:
        h = heads([row[node * nvl : (node + 1) * nvl] for row in m[p]], nvl)
        send_nvl += [h[t] for t in range(len(m[p])) if any_node[p][t][node]]
    counts = [len(r) for r in rows_from]
    gbl_prefix = [sum(counts[: s + 1]) for s in range(num_ranks)]
    recv_gbl_channel = [
        [gbl_prefix[s] - counts[s] + v for v in channel_prefix([[row[rank]] for row in m[s]], 1, False)[0]]
        for s in range(num_ranks)
    ]
    meta = []
    for s in range(num_ranks):
        for t in rows_from[s]:
            meta.append([s // nvl, sum(int(m[s][t][node * nvl + j]) << j for j in range(nvl))])
    meta += [[0, 0]] * (num_rows - real)
    return (
        in_rank[rank].clone(),
        i32(channel_prefix(any_node[rank], nodes), nodes, num_channels),
        i32(channel_prefix(mine, num_ranks), num_ranks, num_channels),
        i32(recv_rdma_channel, nodes, num_channels),
        i32(recv_rdma_prefix, nodes),
        i32(recv_gbl_channel, num_ranks, num_channels),
        i32(gbl_prefix, num_ranks),
        i32(meta, num_rows, 2).view(torch.uint8),
        i32(heads(any_node[rank], nodes), t_mine, nodes),
        i32(send_nvl, len(send_nvl), nvl),
    )


def _gather_rows(t: torch.Tensor, world_size: int) -> list[torch.Tensor]:
    """Every rank's ``t`` (first dimension may differ between ranks)."""
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(world_size)]
    dist.all_gather(sizes, torch.tensor([t.shape[0]]))
    top = max(int(s) for s in sizes)
    padded = torch.zeros(top, *t.shape[1:], dtype=t.dtype)
    padded[: t.shape[0]] = t
    out = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(out, padded)
    return [o[: int(s)] for o, s in zip(out, sizes)]


def check_handle_is_deep_eps_intranode(rank: int, world_size: int) -> None:
    """DeepEP's intranode test on the normal-mode handle: it is upstream's 6-tuple; rows
    ``[rank_prefix_matrix[i-1][rank], rank_prefix_matrix[i][rank])`` of ``x = ones * rank`` all equal ``i``;
    ``recv_src_idx`` is each row's source token; ``is_token_in_rank`` the layout's; the channel matrices and
    ``send_head`` upstream's kernels' values for ``Config(num_sms)`` (simulated token by token); the handle
    combines and replays as the ops' own (bitwise), with and without ``num_worst_tokens``."""
    import torch_ascend_moe.deep_ep as deep_ep

    experts = 2 * world_size
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e9))
    _, idx, w = _routing(rank, 9 + 4 * rank, 2, experts, seed=150)
    t = idx.shape[0]
    x = torch.ones(t, 256, dtype=torch.bfloat16) * rank
    ids = torch.arange(t, dtype=torch.float32)[:, None].expand(t, 8).contiguous()  # each row's token id
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    everyone = _gather_rows(in_rank, world_size)
    for num_sms, with_topk in ((20, True), (4, False), (6, True)):
        config = deep_ep.Config(num_sms)
        args = dict(num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
        if with_topk:
            args.update(topk_idx=idx, topk_weights=w)
        recv, *_, handle, _ = buffer.dispatch(x, config=config, **args)
        assert isinstance(handle, tuple) and len(handle) == 6, f"handle has {len(handle)} fields"
        prefix, send_prefix, recv_channel, src_idx, handle_in_rank, send_head = handle
        for name, field, dtype in zip(
            (
                "rank_prefix_matrix",
                "channel_prefix_matrix",
                "recv_channel_prefix_matrix",
                "recv_src_idx",
                "is_token_in_rank",
                "send_head",
            ),
            handle,
            (torch.int32,) * 4 + (torch.bool, torch.int32),
        ):
            assert field.dtype == dtype, f"{name}: {field.dtype}"
        assert prefix.shape == (world_size, world_size) and send_prefix.shape == (world_size, num_sms // 2)
        assert recv_channel.shape == (world_size, num_sms // 2) and src_idx.shape == (recv.shape[0],)
        for i in range(world_size):  # upstream's check_data
            begin = int(prefix[i - 1][rank]) if i else 0
            block = recv[begin : int(prefix[i][rank])]
            assert block.shape[0] > 0 and bool((block == i).all()), f"rows from rank {i} are not rank {i}'s"
        assert int(prefix[-1][rank]) == recv.shape[0]
        assert torch.equal(handle_in_rank, in_rank)
        ref = reference_handle(rank, num_sms // 2, everyone)
        for name, got, want in zip(
            (
                "rank_prefix_matrix",
                "channel_prefix_matrix",
                "recv_channel_prefix_matrix",
                "recv_src_idx",
                "is_token_in_rank",
                "send_head",
            ),
            handle,
            ref,
        ):
            assert torch.equal(got, want), f"{name}:\n{got}\n!=\n{want}"
        # recv_src_idx names the rows' source tokens: the rows of the token ids say so too.
        recv_ids, *_ = buffer.dispatch(ids, config=config, **args)
        assert torch.equal(src_idx.float(), recv_ids[:, 0])
        # The handle replays and combines as the ops' own handle, bitwise.
        cached, *_ = buffer.dispatch(ids, handle=handle)
        assert torch.equal(cached, recv_ids)
        assert torch.equal(buffer.dispatch(ids, handle=handle.ep)[0], recv_ids)
        combined, _, _ = buffer.combine(recv, handle)
        assert torch.equal(combined, buffer.combine(recv, handle.ep)[0])
        expected = x.float() * in_rank.sum(1, keepdim=True).float()
        assert calc_diff(combined.float(), expected) < 1e-6
        # Static capacity: the same fields, recv_src_idx padded with -1.
        worst = 2 * 13 * world_size
        recv_w, *_, handle_w, _ = buffer.dispatch(x, config=config, num_worst_tokens=worst, **args)
        assert recv_w.shape[0] == worst and handle_w[3].shape == (worst,)
        want = reference_handle(rank, num_sms // 2, everyone, worst)
        for k in range(6):
            assert torch.equal(handle_w[k], want[k]), f"num_worst_tokens: field {k}"
        assert torch.equal(buffer.combine(recv_w, handle_w)[0], combined)
        assert torch.equal(buffer.dispatch(ids, handle=handle_w)[0][: recv.shape[0]], recv_ids)


def check_repacked_handle_is_refused(rank: int, world_size: int) -> None:
    """A tuple without the dispatch's ``.ep`` (a user re-packed DeepEP's fields) cannot be replayed here:
    combine and cached dispatch say so, naming the API, the argument, what was expected and what came."""
    import torch_ascend_moe.deep_ep as deep_ep

    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e9))
    x, idx, w = _routing(rank, 6, 2, 2 * world_size, seed=160)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, 2 * world_size)
    recv, *_, handle, _ = buffer.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    for api, call in (
        ("combine", lambda h: buffer.combine(recv, h)),
        ("dispatch", lambda h: buffer.dispatch(x, handle=h)),
    ):
        try:
            call(tuple(handle))
        except ValueError as e:
            text = str(e)
            assert f"deep_ep.Buffer.{api}" in text and "'handle'" in text and "expected" in text, text
            assert "got tuple of length 6" in text, text
        else:
            raise AssertionError(f"deep_ep.Buffer.{api} accepted a tuple without .ep")


def check_ranks_with_nothing_to_send(rank: int, world_size: int) -> None:
    """A rank with no tokens, and tokens that all stay home or go nowhere (every id -1): DeepEP puts no limit on
    either (specs/deepep_api.md §3, §5.2). Normal dispatch/combine of ``Buffer`` and ``ElasticBuffer`` (a peer
    that never sent a row has no shared region: its block is empty) and the low-latency FP8 dispatch with UE8M0
    scales at T = 0."""
    import torch_ascend_moe.deep_ep as deep_ep

    experts, k, hidden = 4 * world_size, 2, 256
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e8), 0)
    elastic = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=8, hidden=hidden, num_topk=k)
    for case in ("home", "dropped"):
        t = (4 if rank == 0 else 0) if case == "home" else 3
        idx = torch.tensor([[0, 1]] * t, dtype=torch.int64).view(t, k) if case == "home" else torch.full((t, k), -1)
        g = torch.Generator().manual_seed(rank)
        x, w = torch.randn(t, hidden, generator=g).bfloat16(), torch.rand(t, k, generator=g)
        copies = (idx >= 0).any(1, keepdim=True).float()  # one copy per token on rank 0's two experts
        per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
        recv, _, recv_w, _, handle, _ = buffer.dispatch(x, None, per_rank, None, in_rank, per_expert, idx, w)
        combined, _, _ = buffer.combine(recv, handle, recv_w)
        assert torch.equal(combined.float(), x.float() * copies), f"Buffer, {case}"
        recv, _, recv_w, handle, _ = elastic.dispatch(x, idx, w, num_experts=experts, num_max_tokens_per_rank=8)
        combined, _, _ = elastic.combine(recv, handle, recv_w)
        assert combined.shape == (t, hidden), f"ElasticBuffer, {case}"
        assert torch.equal(combined.float(), x.float() * copies), f"ElasticBuffer, {case}"
    t_max, hidden = 8, 2048
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(t_max, hidden, world_size, experts)
    low = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=experts // world_size)
    t = 4 if rank == 0 else 0
    x, idx = torch.randn(t, hidden).bfloat16(), torch.arange(k).repeat(t, 1)
    for ue8m0 in (False, True):
        (data, scales), count, _, _, _ = low.low_latency_dispatch(
            x, idx, t_max, experts, use_fp8=True, round_scale=True, use_ue8m0=ue8m0
        )
        local = experts // world_size  # rank 0's four tokens each go to its experts 0 and 1
        assert count.tolist() == ([4, 4] + [0] * (local - 2) if rank == 0 else [0] * local)
        assert scales.dtype == (torch.int32 if ue8m0 else torch.float32), scales.dtype


def _low_latency_setup(rank: int, world_size: int):
    import torch_ascend_moe.deep_ep as deep_ep

    t_max, experts = 8, 2 * world_size
    x, idx, w = _routing(rank, 5 + rank, 3, experts, seed=120)
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(t_max, x.shape[1], world_size, experts)
    buffer = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=experts // world_size)
    return buffer, t_max, experts, x, idx, w


def check_low_latency_handle_is_deep_eps(rank: int, world_size: int) -> None:
    """The low-latency handle is DeepEP's 5-tuple ``(packed_recv_src_info, packed_recv_layout_range,
    num_max_dispatch_tokens_per_rank, hidden, num_experts)``; combine takes it (or a copy) back."""
    buffer, t_max, experts, x, idx, w = _low_latency_setup(rank, world_size)
    recv, count, handle, _, _ = buffer.low_latency_dispatch(x, idx, t_max, experts, use_fp8=False)
    assert isinstance(handle, tuple) and len(handle) == 5, f"handle has {len(handle)} fields"
    src_info, layout_range, t, hidden, e = handle
    local = experts // world_size
    assert src_info.dtype == torch.int32 and src_info.shape == (local, world_size * t_max)
    assert layout_range.dtype == torch.int64 and layout_range.shape == (local, world_size)
    assert (t, hidden, e) == (t_max, x.shape[1], experts)
    expected = x.float() * torch.where(idx >= 0, w, 0).sum(1, keepdim=True)
    for h in (handle, tuple(handle)):
        combined, _, _ = buffer.low_latency_combine(recv, idx, w, h)
        assert calc_diff(combined.float(), expected) < 1e-5
    assert buffer.get_next_low_latency_combine_buffer(handle).shape == recv.shape


def check_zero_copy_combine_reads_the_buffer(rank: int, world_size: int) -> None:
    """DeepEP's zero-copy combine: expert outputs written into ``get_next_low_latency_combine_buffer(handle)``
    are what ``low_latency_combine(..., zero_copy=True)`` combines (the ``x`` passed is not read), bitwise
    equal to the copying combine of the same outputs; the buffer is the same tensor on every call."""
    buffer, t_max, experts, x, idx, w = _low_latency_setup(rank, world_size)
    recv, _, handle, _, _ = buffer.low_latency_dispatch(x, idx, t_max, experts, use_fp8=False)
    scale = torch.arange(1, experts // world_size + 1, dtype=torch.bfloat16).view(-1, 1, 1)
    y = recv * scale  # one "expert" per local expert
    reference, _, _ = buffer.low_latency_combine(y, idx, w, handle)
    target = buffer.get_next_low_latency_combine_buffer(handle)
    assert target.shape == recv.shape and target.dtype == torch.bfloat16
    target[:, :, :] = y
    assert buffer.get_next_low_latency_combine_buffer(handle).data_ptr() == target.data_ptr()
    garbage = torch.full_like(y, float("nan"))
    out = torch.empty_like(x)
    combined, _, _ = buffer.low_latency_combine(garbage, idx, w, handle, zero_copy=True, out=out)
    assert combined is out and torch.equal(combined, reference), "zero_copy=True did not combine the buffer"


def _expect_runtime_error(fn, present: tuple, absent: tuple = ()) -> float:
    start = time.monotonic()
    try:
        fn()
    except RuntimeError as e:
        text = str(e)
        assert all(p in text for p in present) and not any(a in text for a in absent), text
        return time.monotonic() - start
    raise AssertionError(f"expected a RuntimeError with {present}")


def check_timeout_is_settable(rank: int, world_size: int) -> None:
    """``deep_ep.Buffer(..., num_cpu_timeout_secs=...)`` (default 100 s, DeepEP V1's compiled-in CPU timeout)
    bounds every wait: a rank that never calls dispatch gives the others an error naming the timeout."""
    import torch_ascend_moe.deep_ep as deep_ep

    assert deep_ep.Buffer(dist.group.WORLD).num_cpu_timeout_secs == 100
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e9), num_cpu_timeout_secs=2)
    x, idx, w = _routing(rank, 4, 2, 2 * world_size, seed=130)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, 2 * world_size)
    dist.barrier()
    if rank == 0:
        elapsed = _expect_runtime_error(
            lambda: buffer.dispatch(
                x,
                num_tokens_per_rank=per_rank,
                is_token_in_rank=in_rank,
                num_tokens_per_expert=per_expert,
                topk_idx=idx,
                topk_weights=w,
            ),
            ("did not complete within 2 s", "a rank never arrived"),
        )
        assert elapsed < 30, f"a 2 s timeout took {elapsed:.1f} s"
    else:
        time.sleep(6)  # never dispatches; outlives rank 0's timeout
    os._exit(0)  # the group is out of step now: no final barrier


def check_dead_peer_error_says_so(rank: int, world_size: int) -> None:
    """A peer that exited is reported as such, at once, not as "did not complete within 100 s"."""
    import torch_ascend_moe.deep_ep as deep_ep

    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e9))
    x, idx, w = _routing(rank, 4, 2, 2 * world_size, seed=140)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, 2 * world_size)
    dist.barrier()
    if rank != 0:
        os._exit(0)  # dies without dispatching
    time.sleep(1)
    elapsed = _expect_runtime_error(
        lambda: buffer.dispatch(
            x,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=w,
        ),
        ("a peer rank exited or crashed", "before its 100 s timeout"),
        ("did not complete within",),
    )
    assert elapsed < 30, f"the error took {elapsed:.1f} s"
    os._exit(0)


def fused_a2a_autograd(fused_dispatch, fused_combine, rank: int, world_size: int, async_finish: bool) -> None:
    """Megatron-LM's DeepEP path (``megatron/core/transformer/moe/fused_a2a.py``: ``fused_dispatch`` /
    ``fused_combine``, autograd Functions whose backward is DeepEP's combine / cached dispatch) through a stand-in
    expert ``y = recv_x * 2^rank`` and a loss on the received probabilities, checked against the closed forms:
    ``combined[t] = x[t] * m[t]`` and ``d loss / d x[t] = g[t] * m[t]`` with ``m[t] = Σ 2^r`` over the ranks that own
    one of ``t``'s experts, ``d loss / d probs[t, k] = r + 0.5`` for the owner ``r`` of expert ``idx[t, k]`` (0 for
    ``-1``). Called with Megatron's own file by ``tools/megatron_fused_a2a_check.py`` and with our transcription of
    its calls by ``check_megatron_fused_a2a_calls``."""
    experts, t, k = 8, 24, 3
    per_rank = experts // world_size
    x, idx, w = _routing(rank, t, k, experts, seed=41)
    x.requires_grad_(True)
    w.requires_grad_(True)
    g = torch.Generator().manual_seed(97 + rank)
    gy = torch.randn(t, x.shape[1], generator=g)
    group = dist.group.WORLD
    recv_x, recv_idx, recv_w, tokens_per_expert, handle = fused_dispatch(
        x, idx, w, experts, group, async_finish=async_finish
    )
    assert int(tokens_per_expert.sum()) == int((recv_idx >= 0).sum()) and len(tokens_per_expert) == per_rank
    combined, _ = fused_combine(recv_x * 2.0**rank, group, handle, async_finish=async_finish)
    loss = (combined.float() * gy).sum() + (recv_w * (recv_idx >= 0) * (rank + 0.5)).sum()
    loss.backward()
    owner = torch.where(idx >= 0, idx // per_rank, -1)
    m = torch.stack([sum(2.0**r * (owner[i] == r).any() for r in range(world_size)) for i in range(t)])
    torch.testing.assert_close(combined.float(), (x.detach().float() * m[:, None]).bfloat16().float())
    torch.testing.assert_close(x.grad.float(), (gy.bfloat16().float() * m[:, None]).bfloat16().float())
    torch.testing.assert_close(w.grad, torch.where(owner >= 0, owner + 0.5, 0.0))


def check_megatron_fused_a2a_calls(rank: int, world_size: int) -> None:
    """Megatron-LM's ``fused_a2a.py`` calls, transcribed (its buffer sizing from the dispatch/combine configs'
    hints, ``get_dispatch_layout`` -> ``dispatch`` with ``EventOverlap(EventHandle())`` as the previous event,
    ``current_stream_wait``, combine with ``topk_weights`` in the dispatch's backward, the cached dispatch in the
    combine's backward), synchronous and ``async_finish``."""
    from torch_ascend_moe.deep_ep import Buffer
    from torch_ascend_moe.deep_ep.utils import EventHandle, EventOverlap

    def buffer_for(group, hidden_bytes):
        nvl = rdma = 0
        for config in (Buffer.get_dispatch_config(group.size()), Buffer.get_combine_config(group.size())):
            nvl = max(config.get_nvl_buffer_size_hint(hidden_bytes, group.size()), nvl)
            rdma = max(config.get_rdma_buffer_size_hint(hidden_bytes, group.size()), rdma)
        return Buffer(group, nvl, rdma)

    def event(async_finish):
        return EventOverlap(EventHandle()) if async_finish else None

    class Dispatch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, idx, probs, experts, group, async_finish):
            buffer = buffer_for(group, x.size(1) * max(x.element_size(), 2))
            per_rank, per_rdma, per_expert, in_rank, ev = buffer.get_dispatch_layout(
                idx, experts, previous_event=event(async_finish), async_finish=async_finish
            )
            recv_x, recv_idx, recv_probs, counts, handle, after = buffer.dispatch(
                x, topk_idx=idx, topk_weights=probs, num_tokens_per_rank=per_rank, num_tokens_per_rdma_rank=per_rdma,
                is_token_in_rank=in_rank, num_tokens_per_expert=per_expert, previous_event=ev,
                async_finish=async_finish,
            )  # fmt: skip
            if async_finish:
                after.current_stream_wait()
            ctx.buffer, ctx.handle, ctx.async_finish = buffer, handle, async_finish
            return recv_x, recv_idx, recv_probs, torch.tensor(counts), handle

        @staticmethod
        def backward(ctx, grad_x, _idx, grad_probs, _counts, _handle):
            grad, grad_probs, after = ctx.buffer.combine(
                grad_x.contiguous(), ctx.handle, topk_weights=grad_probs.float(),
                previous_event=event(ctx.async_finish), async_finish=ctx.async_finish,
            )  # fmt: skip
            if ctx.async_finish:
                after.current_stream_wait()
            return grad, None, grad_probs, None, None, None

    class Combine(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, group, handle, async_finish):
            buffer = buffer_for(group, x.size(1) * max(x.element_size(), 2))
            combined, _, after = buffer.combine(
                x, handle=handle, previous_event=event(async_finish), async_finish=async_finish
            )
            if async_finish:
                after.current_stream_wait()
            ctx.buffer, ctx.handle, ctx.async_finish = buffer, handle, async_finish
            return combined, None

        @staticmethod
        def backward(ctx, grad, _none):
            grad_x, *_, after = ctx.buffer.dispatch(
                grad.contiguous(), handle=ctx.handle, previous_event=event(ctx.async_finish),
                async_finish=ctx.async_finish,
            )  # fmt: skip
            if ctx.async_finish:
                after.current_stream_wait()
            return grad_x, None, None, None

    def dispatch(x, idx, probs, experts, group, async_finish=False):
        return Dispatch.apply(x.contiguous(), idx, probs, experts, group, async_finish)

    def combine(x, group, handle, async_finish=False):
        return Combine.apply(x, group, handle, async_finish)

    for async_finish in (False, True):
        fused_a2a_autograd(dispatch, combine, rank, world_size, async_finish)


CHECKS = {name[len("check_") :]: fn for name, fn in dict(globals()).items() if name.startswith("check_")}


def upstream_style(local_rank: int, num_local_ranks: int, port: int) -> None:
    """A scaled-down DeepEP intranode test written against ``deep_ep.utils`` as upstream's tests are:
    ``init_dist`` from the environment, FP8 casts, ``inplace_unique`` layout reference, ``calc_diff``,
    ``bench`` / ``bench_kineto``, plus upstream's exact values of the math helpers."""
    os.environ["MASTER_PORT"] = str(port)
    try:
        import torch_ascend_moe.deep_ep as deep_ep
        from torch_ascend_moe.deep_ep.utils import EventHandle, event
        from torch_ascend_moe.deep_ep.utils.envs import dist_print, get_global_seed, get_local_seed, init_dist
        from torch_ascend_moe.deep_ep.utils.math import (
            align,
            calc_diff,
            ceil_div,
            count_bytes,
            hash_tensor,
            hash_tensors,
            inplace_unique,
            per_token_cast_back,
            per_token_cast_to_fp8,
            safe_div,
        )
        from torch_ascend_moe.deep_ep.utils.testing import bench, bench_kineto

        rank, num_ranks, group = init_dist(local_rank, num_local_ranks, seed=5)
        assert torch.get_default_dtype() == torch.bfloat16 and (get_local_seed(), get_global_seed()) == (5 + rank, 5)
        assert event.EventOverlap is deep_ep.EventOverlap and EventHandle is deep_ep.EventHandle
        dist_print("deep_ep.utils: init_dist ok", once_in_node=True)

        # Upstream's values of the helpers.
        assert calc_diff(torch.zeros(3), torch.zeros(3)) == 0  # the +1: defined for all-zero inputs
        a, b = torch.tensor([1.0, -2.0], dtype=torch.float64), torch.tensor([1.5, -2.0], dtype=torch.float64)
        ref = 1 - 2 * ((a + 1) * (b + 1)).sum() / ((a + 1) ** 2 + (b + 1) ** 2).sum()
        assert abs(calc_diff(a, b) - float(ref)) < 1e-12
        assert (ceil_div(5, 4), align(5, 4), safe_div(0, 0), safe_div(3, 2)) == (2, 8, 0, 1.5)
        rows = torch.tensor([[3, 1, 3, -1], [0, 0, 0, 0], [-1, -1, 2, 1]])
        inplace_unique(rows, 4)
        assert rows.tolist() == [[3, 1, -1, -1], [0, -1, -1, -1], [2, 1, -1, -1]]
        t = torch.tensor([1, 2, 3], dtype=torch.int32)
        assert hash_tensor(t) == 6 and hash_tensors(t, (t, None)) == 0 and count_bytes(t, (t, None)) == 24
        x = torch.randn(4, 200, dtype=torch.float32).to(torch.bfloat16)
        x8, sf = per_token_cast_to_fp8(x)
        assert x8.dtype == torch.float8_e4m3fn and x8.shape == (4, 200) and sf.shape == (4, 2)
        assert sf.dtype == torch.float32 and calc_diff(per_token_cast_back(x8, sf), x) < 1e-3
        pow2 = torch.tensor([[2.0**-3, 2.0**-5, 1.0, 2.0]], dtype=torch.float32)
        # UE8M0: the exponent bytes, 4 per int32
        packed = (pow2.view(torch.int32) >> 23).to(torch.uint8).view(torch.int32)
        ones = torch.ones(1, 512).to(torch.float8_e4m3fn)
        back = per_token_cast_back(ones, packed).float()
        assert torch.equal(back, pow2.repeat_interleave(128, dim=1)), back

        # DeepEP's intranode test, scaled down.
        num_tokens, hidden, num_topk, num_experts = 16, 256, 3, 4 * num_ranks
        x = torch.ones((num_tokens, hidden), dtype=torch.bfloat16) * rank
        x_e4m3 = per_token_cast_to_fp8(x) if deep_ep.Buffer.is_sm90_compiled() else None
        scores = torch.randn((num_tokens, num_experts), dtype=torch.float32).abs() + 1
        topk_idx = torch.topk(scores, num_topk, dim=-1, largest=True, sorted=False)[1]
        topk_weights = torch.ones((num_tokens, num_topk), dtype=torch.float32) * rank
        rank_idx = topk_idx // (num_experts // num_ranks)
        rank_idx.masked_fill_(topk_idx == -1, -1)
        inplace_unique(rank_idx, num_ranks)
        ref_num_tokens_per_rank = torch.stack([(rank_idx == i).sum() for i in range(num_ranks)]).int()
        buffer = deep_ep.Buffer(group, int(1e9))
        per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
        assert torch.equal(per_rank, ref_num_tokens_per_rank)
        gbl_per_rank = per_rank.clone()
        dist.all_reduce(gbl_per_rank, group=group)
        for current_x in filter(lambda elem: elem is not None, (x, x_e4m3)):
            for with_topk in (False, True):
                args = {"x": current_x, "num_tokens_per_rank": per_rank, "is_token_in_rank": in_rank}
                args["num_tokens_per_expert"] = per_expert
                if with_topk:
                    args.update(topk_idx=topk_idx, topk_weights=topk_weights)
                recv_x, _, _, counts, handle, ev = buffer.dispatch(**args)
                ev.current_stream_wait()
                recv_x = per_token_cast_back(*recv_x) if isinstance(recv_x, tuple) else recv_x
                assert recv_x.shape[0] == int(gbl_per_rank[rank]) and len(counts) == num_experts // num_ranks
                combined, _, _ = buffer.combine(recv_x, handle)
                copies = in_rank.sum(dim=1, keepdim=True).to(torch.bfloat16)
                assert calc_diff(combined.float() / copies.float(), x.float()) < 5e-6
        avg, lo, hi = bench(lambda: buffer.get_dispatch_layout(topk_idx, num_experts), num_warmups=2, num_tests=4)
        assert 0 < lo <= avg <= hi
        t = bench_kineto(
            lambda: buffer.dispatch(x, **{k: v for k, v in args.items() if k != "x"}),
            "ep_dispatch",
            num_tests=2,
            barrier_comm_profiling=True,
        )
        assert t > 0, t
        # Upstream's names ("dispatch", "combine": its CUDA kernels'), which also name our ops' helper kernels.
        recv_x, _, _, _, handle, _ = buffer.dispatch(x, **{k: v for k, v in args.items() if k != "x"})
        for name, fn in (
            ("dispatch", lambda: buffer.dispatch(x, **{k: v for k, v in args.items() if k != "x"})),
            ("combine", lambda: buffer.combine(recv_x, handle)),
        ):
            t = bench_kineto(fn, name, num_tests=2, suppress_kineto_output=True)
            assert t > 0, (name, t)
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def internode_handle(rank: int, world_size: int, store_path: str) -> None:
    """DeepEP's internode test on the handle, on ``world_size`` > 8 spawned gloo ranks (nodes of 8): the
    10-tuple; rows ``[handle[-4][i-1], handle[-4][i])`` of ``x = ones * rank`` all equal ``i``; every field
    equals upstream's kernels simulated token by token; combine and cached dispatch take it."""
    store = dist.FileStore(store_path, world_size)
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=120)
    )
    try:
        import torch_ascend_moe.deep_ep as deep_ep

        experts = 2 * world_size
        buffer = deep_ep.Buffer(dist.group.WORLD, int(1e9), int(1e9))
        _, idx, w = _routing(rank, 3 + rank % 5, 3, experts, seed=170)
        x = torch.ones(idx.shape[0], 128, dtype=torch.bfloat16) * rank
        per_rank, per_node, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
        assert per_node is not None and per_node.shape == (world_size // 8,)
        config = deep_ep.Config(6)
        recv, *_, handle, _ = buffer.dispatch(
            x,
            num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_node,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=w,
            config=config,
        )
        assert isinstance(handle, tuple) and len(handle) == 10, f"handle has {len(handle)} fields"
        prefix = handle[-4]
        for i in range(world_size):  # upstream test_internode's check_data
            block = recv[(int(prefix[i - 1]) if i else 0) : int(prefix[i])]
            assert bool((block == i).all()), f"rows from rank {i} are not rank {i}'s"
        assert int(prefix[-1]) == recv.shape[0]
        want = reference_handle(rank, 3, _gather_rows(in_rank, world_size))
        for k, (got, exp) in enumerate(zip(handle, want)):
            assert got.dtype == exp.dtype and torch.equal(got, exp), f"field {k}"
        combined, _, _ = buffer.combine(recv, handle)
        assert torch.equal(combined, buffer.combine(recv, handle.ep)[0])
        assert torch.equal(buffer.dispatch(x, handle=handle)[0], recv)
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    os._exit(0)


def run_check(rank: int, world_size: int, store_path: str, name: str) -> None:
    run_named(CHECKS, rank, world_size, store_path, name)
