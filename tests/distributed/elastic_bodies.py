"""DeepEP V2 ``ElasticBuffer`` checks (issue 16, specs/deepep_api.md §2.4, §4.5-§5.4, §8.4), run on each rank of
spawned gloo processes by tests/ep/test_deep_ep_elastic.py, one named check per spawn.

``check_upstream_test_ep`` is DeepEP's ``tests/elastic/test_ep.py::test_dispatch_combine`` on CPU: the same mode
matrix, the same references (``deep_ep.utils.refs``), the same assertions (bitwise), minus the kernel timing."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from tests.distributed import run_named
from torch_ascend_moe.testing import calc_diff


def _modes():
    """Upstream's ``enumerate_ep_modes`` (144 cases)."""
    for do_handle_copy in (1, 0):
        for expert_alignment in (128, 1):
            for use_fp8_dispatch in (1, 0):
                for num_bias in (0, 1, 2):
                    for with_previous_event in (0, 1):
                        for async_with_compute_stream in (0, 1):
                            for allocate_on_comm_stream in (1,) if with_previous_event else (0, 1):
                                yield (
                                    do_handle_copy,
                                    expert_alignment,
                                    use_fp8_dispatch,
                                    num_bias,
                                    with_previous_event,
                                    async_with_compute_stream,
                                    allocate_on_comm_stream,
                                )


def _fold_expanded(expanded, indices, valid_mask):
    if not isinstance(expanded, torch.Tensor):
        return tuple(_fold_expanded(t, indices, valid_mask) for t in expanded)
    gathered = expanded[indices]
    first_valid_idx = valid_mask.to(torch.int).argmax(dim=1)
    folded = gathered[torch.arange(gathered.shape[0]), first_valid_idx]
    result = (gathered == folded.unsqueeze(1)).all(dim=-1) | (~valid_mask)
    assert result.all()
    return folded


def check_upstream_test_ep(
    rank: int,
    world_size: int,
    *,
    do_cpu_sync=1,
    allow_multiple_reduction=1,
    deterministic=False,
    masked_ratio=0.0,
    allow_hybrid_mode=1,
    num_tokens=48,
    hidden=128,
    num_topk=4,
    num_experts=16,
    modes_step=1,
) -> None:
    import torch_ascend_moe.deep_ep as deep_ep
    from torch_ascend_moe.deep_ep.utils import envs
    from torch_ascend_moe.deep_ep.utils.gate import get_unbalanced_scores
    from torch_ascend_moe.deep_ep.utils.math import align, per_token_cast_back, per_token_cast_to_fp8
    from torch_ascend_moe.deep_ep.utils.refs import combine as ref_combine
    from torch_ascend_moe.deep_ep.utils.refs import dispatch as ref_dispatch
    from torch_ascend_moe.deep_ep.utils.refs import generate_pre_combine_data, ordered_accumulate

    envs.init_seed(0)
    group = dist.new_group(list(range(world_size)))
    buffer = deep_ep.ElasticBuffer(
        group,
        num_max_tokens_per_rank=num_tokens,
        hidden=hidden,
        deterministic=deterministic,
        allow_hybrid_mode=bool(allow_hybrid_mode),
        allow_multiple_reduction=bool(allow_multiple_reduction),
        explicitly_destroy=True,
        num_cpu_timeout_secs=60,
    )
    num_scaleout_ranks, num_scaleup_ranks = buffer.get_logical_domain_size()
    num_max_tokens_per_rank, t = num_tokens, max(1, num_tokens - dist.get_rank())
    num_local_experts = num_experts // buffer.num_ranks
    num_sms = buffer.get_theoretical_num_sms(num_experts, num_topk)
    num_qps = buffer.get_theoretical_num_qps(num_sms)
    scores = get_unbalanced_scores(t, num_experts, buffer.num_ranks, num_topk, 1.0, False)
    topk_weights, topk_idx = torch.topk(scores, num_topk, dim=-1, largest=True, sorted=False)
    topk_idx = topk_idx.to(deep_ep.topk_idx_t)
    if masked_ratio > 0:
        topk_idx.masked_fill_(torch.rand_like(topk_idx, dtype=torch.float) < masked_ratio, -1)
        topk_weights.masked_fill_(topk_idx < 0, 0)

    for case, mode in enumerate(_modes()):
        if case % modes_step:
            continue
        (
            do_handle_copy,
            expert_alignment,
            use_fp8_dispatch,
            num_bias,
            with_previous_event,
            async_with_compute_stream,
            allocate_on_comm_stream,
        ) = mode
        x = torch.randn((t, hidden), dtype=torch.bfloat16)
        x = per_token_cast_to_fp8(x) if use_fp8_dispatch else x
        bias = torch.randn((t, hidden), dtype=torch.bfloat16) if num_bias == 1 else None
        if num_bias == 2:
            bias = tuple(torch.randn((t, hidden), dtype=torch.bfloat16) for _ in range(2))

        def bf16(recv_x, fp8=use_fp8_dispatch):
            return per_token_cast_back(recv_x[0], recv_x[1]) if fp8 else recv_x

        def launch(name, params, event=with_previous_event, wait=async_with_compute_stream):
            """Upstream's launch: an optional previous event, and waiting on the returned one when async."""
            if event:
                params.update(previous_event=buffer.capture())
            values = getattr(buffer, name)(**params)
            values[-1].current_stream_wait() if wait else ()
            return values

        ref_recv_x, ref_recv_topk_idx, ref_recv_topk_weights, ref_recv_src_token_idx, ref_num_recv_tokens_per_rank = (
            ref_dispatch(x, topk_idx, topk_weights, num_max_tokens_per_rank, num_experts)
        )
        if allow_multiple_reduction:
            recipe = (True, True) if allow_hybrid_mode and num_scaleout_ranks > 1 else (True, False)
            reduced_recipe = recipe
        else:
            reduced_recipe, recipe = (False, False), (True, False)
        ref_y = generate_pre_combine_data(
            dist.get_rank() * num_max_tokens_per_rank + torch.arange(t), num_max_tokens_per_rank, num_topk, hidden
        )
        ref_y[topk_idx == -1] = 0
        ref_reduced = ref_combine(
            ref_y, topk_idx, num_scaleout_ranks, num_scaleup_ranks, num_experts, bias, *reduced_recipe
        )
        ref_combined = ref_combine(ref_y, topk_idx, num_scaleout_ranks, num_scaleup_ranks, num_experts, bias, *recipe)

        dispatch_args = dict(
            x=x,
            topk_idx=topk_idx,
            topk_weights=topk_weights,
            num_sms=num_sms,
            num_qps=num_qps,
            num_max_tokens_per_rank=num_max_tokens_per_rank,
            num_experts=num_experts,
            expert_alignment=expert_alignment,
            async_with_compute_stream=async_with_compute_stream,
            allocate_on_comm_stream=allocate_on_comm_stream,
            do_handle_copy=do_handle_copy,
            do_cpu_sync=do_cpu_sync,
        )
        recv_x, recv_topk_idx, recv_topk_weights, handle, _ = launch("dispatch", dispatch_args)
        recv_x_bf16 = bf16(recv_x)
        expanded_args = dispatch_args | dict(do_expand=True, use_tma_aligned_col_major_sf=True)
        e_recv_x, e_recv_topk_idx, e_recv_topk_weights, e_handle, _ = launch("dispatch", expanded_args)
        e_recv_x_bf16 = bf16(e_recv_x)
        cached_args = dict(
            x=x,
            num_sms=num_sms,
            num_qps=num_qps,
            async_with_compute_stream=async_with_compute_stream,
            allocate_on_comm_stream=allocate_on_comm_stream,
            handle=handle,
        )
        cached_recv_x, cached_recv_topk_idx, _, cached_handle, _ = launch("dispatch", cached_args)
        cached_e_args = cached_args | dict(
            topk_weights=topk_weights,
            do_expand=True,
            use_tma_aligned_col_major_sf=True,
            do_zero_padding=True,
            handle=e_handle,
        )
        cached_e_recv_x, _, cached_e_recv_topk_weights, _, _ = launch("dispatch", cached_e_args)

        n = handle.psum_num_recv_tokens_per_scaleup_rank[-1].item()
        assert n == e_handle.psum_num_recv_tokens_per_scaleup_rank[-1].item()
        src_token_global_idx = handle.recv_src_metadata[:n, 0]
        assert torch.equal(ref_recv_src_token_idx, torch.sort(src_token_global_idx).values)
        local_y = generate_pre_combine_data(src_token_global_idx, num_max_tokens_per_rank, num_topk, hidden)
        local_y[recv_topk_idx[:n] == -1] = 0
        input_for_combine = torch.empty_like(recv_x_bf16, dtype=torch.bfloat16)
        input_for_combine[:n] = ordered_accumulate(local_y)
        e_src = e_handle.recv_src_metadata[:n, 0]
        assert torch.equal(ref_recv_src_token_idx, torch.sort(e_src).values)
        local_y_e = generate_pre_combine_data(e_src, num_max_tokens_per_rank, num_topk, hidden)
        input_for_e_combine = torch.empty((e_recv_x_bf16.shape[0] + 1, hidden), dtype=torch.bfloat16)
        input_for_e_combine[e_handle.recv_src_metadata[:n, 2:].flatten()] = local_y_e.view(-1, hidden)
        input_for_e_combine = input_for_e_combine[:-1]

        combine_args = dict(
            x=input_for_combine,
            topk_weights=recv_topk_weights,
            bias=bias,
            handle=handle,
            num_sms=num_sms,
            num_qps=num_qps,
            async_with_compute_stream=async_with_compute_stream,
            allocate_on_comm_stream=allocate_on_comm_stream,
        )
        combined_x, combined_topk_weights, _ = launch("combine", combine_args)
        reduced_args = dict(
            x=input_for_e_combine,
            bias=bias,
            handle=e_handle,
            num_sms=num_sms,
            num_qps=num_qps,
            async_with_compute_stream=async_with_compute_stream,
            allocate_on_comm_stream=allocate_on_comm_stream,
        )
        if allow_multiple_reduction:
            reduced_args["topk_weights"] = e_recv_topk_weights
        reduced_x, reduced_topk_weights, _ = launch("combine", reduced_args)

        # Handle copy semantics, then the valid part without a CPU sync.
        assert (topk_idx.data_ptr() != handle.topk_idx.data_ptr()) == do_handle_copy
        assert handle.topk_idx.data_ptr() == cached_handle.topk_idx.data_ptr()
        if not do_cpu_sync:
            if use_fp8_dispatch:
                recv_x = (recv_x[0][:n], recv_x[1][:n])
                cached_recv_x = (cached_recv_x[0][:n], cached_recv_x[1][:n])
            else:
                recv_x, cached_recv_x = recv_x[:n], cached_recv_x[:n]
            recv_x_bf16 = recv_x_bf16[:n]
            recv_topk_idx, recv_topk_weights = recv_topk_idx[:n], recv_topk_weights[:n]
            cached_recv_topk_idx = cached_recv_topk_idx[:n]
            handle.recv_src_metadata = handle.recv_src_metadata[:n]
            e_handle.recv_src_metadata = e_handle.recv_src_metadata[:n]
        e_indices = e_handle.recv_src_metadata[:, 2:]
        e_mask = e_indices >= 0
        valid_e = e_indices[e_mask]
        if deterministic:
            twice = launch("dispatch", dict(dispatch_args))
            assert torch.equal(recv_x_bf16, bf16(twice[0])[:n])
            assert torch.equal(handle.recv_src_metadata[:, :1], twice[3].recv_src_metadata[:n, :1])
        stats = torch.zeros((num_local_experts,), dtype=torch.int)
        launch("dispatch", dispatch_args | dict(cumulative_local_expert_recv_stats=stats))
        assert e_recv_topk_idx is None
        assert e_handle.recv_src_metadata.size(0) == n
        safe = e_indices.clone()
        safe[~e_mask] = 0
        cached_e_bf16 = bf16(cached_e_recv_x)
        assert torch.equal(e_recv_x_bf16[valid_e], cached_e_bf16[valid_e])
        assert torch.equal(e_recv_topk_weights[valid_e], cached_e_recv_topk_weights[valid_e])
        for e in range(num_local_experts):
            start = e_handle.psum_num_recv_tokens_per_expert[e].item()
            end = align(start, expert_alignment)
            assert (cached_e_bf16[start:end] == 0).all() and (cached_e_recv_topk_weights[start:end] == 0).all()
        folded_x = _fold_expanded(e_recv_x, safe, e_mask)
        folded_w = e_recv_topk_weights[safe]
        if use_fp8_dispatch:
            assert torch.equal(recv_x[0], cached_recv_x[0]) and torch.equal(recv_x[1], cached_recv_x[1])
        else:
            assert torch.equal(recv_x, cached_recv_x)
        assert torch.equal(recv_topk_idx, cached_recv_topk_idx)
        assert torch.equal(handle.dst_buffer_slot_idx, cached_handle.dst_buffer_slot_idx)
        assert handle.num_recv_tokens_per_expert_list == cached_handle.num_recv_tokens_per_expert_list
        assert recv_x_bf16.size() == bf16(ref_recv_x).size()
        for i in range(num_local_experts if do_cpu_sync else 0):
            ref_count = (ref_recv_topk_idx == i).sum().item()
            assert ref_count == stats[i].item()
            assert align(ref_count, expert_alignment) == handle.num_recv_tokens_per_expert_list[i]
        psum = [0] + handle.psum_num_recv_tokens_per_expert.tolist()
        e_psum = [0] + e_handle.psum_num_recv_tokens_per_expert.tolist()
        for i in range(num_local_experts):
            ref_count = (ref_recv_topk_idx == i).sum().item()
            assert align(ref_count, expert_alignment) == psum[i + 1] - psum[i]
            assert ref_count == e_psum[i + 1] - align(e_psum[i], expert_alignment)
        su = [0] + handle.psum_num_recv_tokens_per_scaleup_rank.tolist()
        for i in range(num_scaleup_ranks):
            assert su[i + 1] - su[i] == sum(ref_num_recv_tokens_per_rank[i::num_scaleup_ranks])
        for check_x, check_idx, check_w, check_handle in (
            (folded_x, None, folded_w, e_handle),
            (recv_x, recv_topk_idx, recv_topk_weights, handle),
        ):
            for i in range(buffer.num_ranks):
                lo = sum(ref_num_recv_tokens_per_rank[:i])
                hi = lo + ref_num_recv_tokens_per_rank[i]
                order = torch.sort(check_handle.recv_src_metadata[:, 0])
                assert torch.equal(ref_recv_src_token_idx[lo:hi], order.values[lo:hi])
                rows = order.indices[lo:hi]
                checks = [(ref_recv_topk_weights, check_w, True)]
                if check_idx is not None:
                    checks.append((ref_recv_topk_idx, check_idx, False))
                if use_fp8_dispatch:
                    checks += [(ref_recv_x[0], check_x[0], False), (ref_recv_x[1], check_x[1], False)]
                else:
                    checks.append((ref_recv_x, check_x, False))
                mask = ref_recv_topk_idx[lo:hi] < 0
                for ref_t, got, do_mask in checks:
                    ref_t, got = ref_t[lo:hi], got[rows]
                    if do_mask:
                        ref_t, got = ref_t.masked_fill(mask, 0), got.masked_fill(mask, 0)
                    assert torch.equal(ref_t, got), f"dispatch data differs (mode {mode})"
        assert torch.equal(combined_x, ref_combined), f"combine differs: {calc_diff(combined_x, ref_combined)} {mode}"
        assert torch.equal(reduced_x, ref_reduced), (
            f"reduced combine differs: {calc_diff(reduced_x, ref_reduced)} {mode}"
        )
        assert torch.equal(combined_topk_weights, topk_weights)
        if allow_multiple_reduction:
            assert torch.equal(reduced_topk_weights, topk_weights)
    buffer.destroy()


def check_combine_adds_in_slot_order(rank: int, world_size: int) -> None:
    """V2 adds the rank partials in top-k slot order, V1 in rank order; FP32 hides the difference for a few
    BF16 terms, so the values make it visible: bias -2^25, rank 0's partial 2^25 (slot 1), rank 1's 1 (slot 0).
    Slot order: (-2^25 + 1) + 2^25 = 0 in FP32 (1 is below -2^25's ulp); rank order gives 1."""
    import torch_ascend_moe.deep_ep as deep_ep
    from torch_ascend_moe.deep_ep.utils.refs import combine as ref_combine

    buffer = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=2, hidden=8, num_cpu_timeout_secs=30)
    topk_idx = torch.tensor([[1, 0]]) if rank == 0 else torch.full((1, 2), -1)  # experts 0 | 1 on ranks 0 | 1
    x = torch.randn(1, 8).bfloat16()
    bias = torch.full((1, 8), -(2.0**25)).bfloat16()
    _, recv_idx, _, handle, _ = buffer.dispatch(x, topk_idx, num_experts=2)
    partial = torch.full((recv_idx.shape[0], 8), 2.0**25 if rank == 0 else 1.0).bfloat16()
    combined, _, _ = buffer.combine(partial, handle, bias=bias)
    if rank == 0:
        y = torch.stack([torch.full((8,), 1.0), torch.full((8,), 2.0**25)]).bfloat16().unsqueeze(0)
        want = ref_combine(y, topk_idx, 1, world_size, 2, bias, True, False)
        assert torch.equal(want, torch.zeros(1, 8).bfloat16()), "the reference lost the ordering effect"
        assert torch.equal(combined, want), f"combine is not in slot order: {combined[0, 0].item()}"


def check_fp8_ue8m0_packs(rank: int, world_size: int) -> None:
    """FP8 rows with int32 SF packs (4 UE8M0 bytes each, V2's other SF form) move bitwise, compact, expanded
    (TMA-aligned column-major) and cached, against ``refs.dispatch``."""
    import torch_ascend_moe.deep_ep as deep_ep
    from torch_ascend_moe.deep_ep.utils.refs import dispatch as ref_dispatch

    buffer = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=12, hidden=256, num_cpu_timeout_secs=30)
    g = torch.Generator().manual_seed(rank)
    t = 12 - 3 * rank
    x = torch.randn(t, 256, generator=g).to(torch.float8_e4m3fn)
    sf = torch.randint(-(2**31), 2**31 - 1, (t, 2), generator=g, dtype=torch.int32)
    idx = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(t)])
    (recv_x, recv_sf), recv_idx, _, handle, _ = buffer.dispatch((x, sf), idx, num_experts=8)
    (ref_x, ref_sf), ref_idx, _, ref_src, _ = ref_dispatch((x, sf), idx, None, 12, 8)
    order = torch.sort(handle.recv_src_metadata[:, 0]).indices
    assert torch.equal(handle.recv_src_metadata[order, 0], ref_src)
    assert torch.equal(recv_x[order].view(torch.uint8), ref_x.view(torch.uint8))
    assert torch.equal(recv_sf[order], ref_sf) and torch.equal(recv_idx[order], ref_idx)
    (ex, esf), _, _, ehandle, _ = buffer.dispatch(
        (x, sf), idx, num_experts=8, do_expand=True, expert_alignment=4, use_tma_aligned_col_major_sf=True
    )
    assert esf.stride() == (1, -(-esf.shape[0] // 4) * 4), f"column-major SF strides: {esf.stride()}"
    rows = ehandle.recv_src_metadata[:, 2:]
    for j in range(rows.shape[0]):
        for r in rows[j][rows[j] >= 0].tolist():
            assert torch.equal(ex[r].view(torch.uint8), recv_x[j].view(torch.uint8)) and torch.equal(esf[r], recv_sf[j])
    (cx, csf), _, _, same, _ = buffer.dispatch((x, sf), handle=handle)
    assert same is handle and torch.equal(cx.view(torch.uint8), recv_x.view(torch.uint8)) and torch.equal(csf, recv_sf)


def check_bad_input_fails_every_rank(rank: int, world_size: int) -> None:
    """A bad argument on one rank (T above the maximum, a wider hidden than the buffer's, different experts)
    raises on every rank, fast (the others are told instead of timing out)."""
    import torch_ascend_moe.deep_ep as deep_ep

    buffer = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=8, hidden=64, num_cpu_timeout_secs=30)
    idx = torch.tensor([[0, 1]] * 8)
    cases = [
        (
            "T > num_max",
            lambda: buffer.dispatch(
                torch.randn(9 if rank == 1 else 8, 64).bfloat16(),
                torch.tensor([[0, 1]] * (9 if rank == 1 else 8)),
                num_experts=4,
            ),
            r"argument 'x' size\(0\) \(T\): expected at most num_max_tokens_per_rank=8, got 9",
        ),
        (
            "hidden",
            lambda: buffer.dispatch(torch.randn(8, 128 if rank == 1 else 64).bfloat16(), idx, num_experts=4),
            r"argument 'x' size\(1\) \(hidden\): expected at most 64",
        ),
        (
            "experts",
            lambda: buffer.dispatch(torch.randn(8, 64).bfloat16(), idx, num_experts=4 if rank else 8),
            r"the ranks disagree on num_experts",
        ),
        (
            "experts not a multiple of ranks",
            lambda: buffer.dispatch(torch.randn(8, 64).bfloat16(), idx, num_experts=3),
            r"argument 'num_experts' value: expected a multiple of the number of ranks \(2\), got 3",
        ),
    ]
    for name, call, own in cases:
        start = time.monotonic()
        try:
            call()
        except ValueError as e:
            text = str(e)
            import re

            if rank == 1 or name.startswith("experts"):
                assert re.search(own, text), f"{name}: {text}"
            else:
                assert "rejected their arguments" in text, f"{name}: {text}"
        else:
            raise AssertionError(f"{name}: no error on rank {rank}")
        assert time.monotonic() - start < 10, f"{name}: the error took {time.monotonic() - start:.1f} s"


def check_experimental(rank: int, world_size: int) -> None:
    """Engram (one-sided fetch of any rank's entries, FP8 scales), PP ring send/recv with several in flight,
    AGRS all_gather (single and batched, limits enforced) against plain references."""
    import torch_ascend_moe.deep_ep as deep_ep
    from torch_ascend_moe.deep_ep.utils.math import per_token_cast_to_fp8

    r = world_size
    buffer = deep_ep.ElasticBuffer(
        dist.group.WORLD, num_bytes=2 << 20, explicitly_destroy=True, num_cpu_timeout_secs=30
    )
    g = torch.Generator().manual_seed(rank)
    for fp8 in (False, True):
        local = torch.randn(16, 32, generator=g).bfloat16()
        sf = None
        if fp8:
            local, local_sf = per_token_cast_to_fp8(local)
            sf = torch.empty(r * 16, local_sf.shape[1])
            dist.all_gather_into_tensor(sf, local_sf)
        buffer.engram_write(local, sf=sf)
        gathered = torch.empty(r * 16, 32, dtype=local.dtype)
        dist.all_gather_into_tensor(gathered.view(torch.uint8), local.view(torch.uint8))
        indices = torch.randint(0, r * 16, (5 + rank, 3), generator=g, dtype=torch.int)
        if rank == 0:  # one-sided: rank 1 fetches nothing this time
            data, fetched_sf = buffer.engram_fetch(indices)()
            assert torch.equal(data.view(torch.uint8), gathered[indices.view(-1)].view(5, -1).view(torch.uint8))
            if fp8:
                assert torch.equal(fetched_sf, sf[indices.view(-1)].view(5, -1))
                col = buffer.engram_fetch(indices, use_tma_aligned_col_major_sf=True)()[1]
                assert torch.equal(col, fetched_sf) and col.stride(0) == 1
        else:  # no tokens: empty rows of the usual widths (a view with -1 could not infer them)
            data, fetched_sf = buffer.engram_fetch(torch.empty(0, 3, dtype=torch.int))()
            assert data.shape == (0, 3 * 32) and data.dtype == local.dtype
            assert fetched_sf is None if not fp8 else fetched_sf.shape == (0, 3 * sf.shape[1])
        buffer.barrier()
    buffer.pp_set_config(4 * 64 * 2, 3)
    peer = (rank + 1) % r
    sent = [torch.randn(4, 64, generator=torch.Generator().manual_seed(100 * rank + i)).bfloat16() for i in range(3)]
    for tensor in sent:
        buffer.pp_send(tensor, peer)
    src = (rank - 1) % r
    for i in range(3):
        got = torch.empty(4, 64, dtype=torch.bfloat16)
        buffer.pp_recv(got, src)
        want = torch.randn(4, 64, generator=torch.Generator().manual_seed(100 * src + i)).bfloat16()
        assert torch.equal(got, want), f"pp message {i} differs"
    try:
        buffer.pp_send(torch.zeros(8, 64).bfloat16(), peer)
        raise AssertionError("pp_send accepted a tensor above num_max_tensor_bytes")
    except ValueError as e:
        assert "at most 512 bytes" in str(e), str(e)
    shape = (3, 5)
    buffer.agrs_set_config(ElasticBuffer_bytes(r, shape, 4), 4)
    with buffer.agrs_new_session():
        t = torch.full(shape, float(rank))
        out, wait = buffer.all_gather(t)
        a, b, wait2 = buffer.all_gather([t + 1, t + 2])
        wait()
        wait2()
        want = torch.stack([torch.full(shape, float(i)) for i in range(r)])
        assert torch.equal(out, want) and torch.equal(a, want + 1) and torch.equal(b, want + 2)
        inplace = buffer.agrs_get_inplace_tensor(shape, torch.float32)
        inplace.copy_(t)
        c, wait3 = buffer.all_gather(inplace)
        wait3()
        assert torch.equal(c, want)
        try:
            buffer.all_gather(t)
            raise AssertionError("all_gather exceeded the session's byte limit silently")
        except RuntimeError as e:
            assert "limits" in str(e), str(e)
    buffer.destroy()


def ElasticBuffer_bytes(r, shape, n):  # noqa: N802  (mirrors the static method it calls)
    import torch_ascend_moe.deep_ep as deep_ep

    return deep_ep.ElasticBuffer.get_agrs_num_max_session_bytes(dist.group.WORLD, [shape] * n, torch.float32)


def check_autograd_expand_gemm_combine(rank: int, world_size: int) -> None:
    """Training through V2: dispatch(do_expand) -> grouped GEMM on the psum layout -> weights -> expanded
    combine, forward and every gradient (x, routing weights, expert weights) against one process holding every
    expert (float64)."""
    import torch_ascend_moe.deep_ep as deep_ep
    from torch_ascend_moe.ops.grouped import m_grouped_bf16_gemm

    r, e, k, h, n = world_size, 2 * world_size, 2, 16, 12
    local = e // r
    buffer = deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=n, hidden=h, num_cpu_timeout_secs=30)
    torch.manual_seed(0)  # every rank: the same experts and every rank's tokens
    weights = torch.randn(e, h, h, dtype=torch.float64)
    xs = [torch.randn(n - i, h, dtype=torch.float64) for i in range(r)]
    idx = [torch.stack([torch.randperm(e)[:k] for _ in range(n - i)]) for i in range(r)]
    ws = [torch.rand(n - i, k, dtype=torch.float64) for i in range(r)]
    for mode in ("sync", "static"):
        x = xs[rank].clone().requires_grad_()
        w = ws[rank].clone().requires_grad_()
        mine = weights[rank * local : (rank + 1) * local].clone().requires_grad_()
        recv_x, _, recv_w, handle, _ = buffer.dispatch(
            x, idx[rank], w, num_experts=e, do_expand=True, expert_alignment=4, do_cpu_sync=mode == "sync"
        )
        y = m_grouped_bf16_gemm(recv_x, mine, handle.psum_num_recv_tokens_per_expert, alignment=4)
        y = y * recv_w.unsqueeze(1)
        out, _, _ = buffer.combine(y, handle)
        c = torch.randn(out.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
        (out * c).sum().backward()
        # One process: every token, every expert.
        ref_x, ref_w = xs[rank].clone().requires_grad_(), ws[rank].clone().requires_grad_()
        full = weights.clone().requires_grad_()
        ref = sum(ref_w[:, j : j + 1] * torch.einsum("th,toh->to", ref_x, full[idx[rank][:, j]]) for j in range(k))
        (ref * c).sum().backward()
        assert calc_diff(out, ref) < 1e-20, f"{mode}: forward differs"
        assert calc_diff(x.grad, ref_x.grad) < 1e-20, f"{mode}: x grad differs"
        assert calc_diff(w.grad, ref_w.grad) < 1e-20, f"{mode}: weight grad differs"
        full_grad = full.grad.clone()
        dist.all_reduce(full_grad)
        assert calc_diff(mine.grad, full_grad[rank * local : (rank + 1) * local]) < 1e-20, f"{mode}: expert grad"


def check_compile_v2_moe(rank: int, world_size: int) -> None:
    """``torch.compile(fullgraph=True)`` of the V2 expert-parallel MoE layer (static shapes), forward and
    backward, equal to eager."""
    from torch_ascend_moe.nn import MoE

    torch.manual_seed(0)
    # An FP64 router: FP32 routing (the default) differs in the last bits once Inductor fuses it.
    moe = MoE(
        32,
        16,
        2 * world_size,
        2,
        dtype=torch.float64,
        ep_group=dist.group.WORLD,
        ep_static_tokens=6,
        ep_expand=True,
        ep_alignment=4,
        router_dtype=torch.float64,
    )
    x = torch.randn(6, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(rank))
    x_eager, x_comp = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_eager = moe(x_eager)
    y_eager.sum().backward()
    grads = [p.grad.clone() for p in moe.parameters()]
    moe.zero_grad()
    compiled = torch.compile(moe, fullgraph=True)
    y_comp = compiled(x_comp)
    y_comp.sum().backward()
    assert torch.allclose(y_comp, y_eager, rtol=1e-12, atol=1e-12), "compiled forward differs"
    assert torch.allclose(x_comp.grad, x_eager.grad, rtol=1e-12, atol=1e-12), "compiled input grad differs"
    for p, g in zip(moe.parameters(), grads):
        assert torch.allclose(p.grad, g, rtol=1e-12, atol=1e-12), "compiled parameter grad differs"


def check_deepep_25_split(rank: int, world_size: int) -> None:
    """DeepEP 2.5.0's ``EPBuffer`` (``ElasticBuffer`` under 2.5.0's constructor: no ``num_cpu_bytes``, the
    load-balance region kept as ``runtime.lb_storage``; ``dispatch(defer_epilogue=True)``) computes what
    ``ElasticBuffer`` does, bitwise; ``PPBuffer`` sends to and receives from ring neighbours in order."""
    import torch_ascend_moe.deep_ep as deep_ep

    g = torch.Generator().manual_seed(7 + rank)
    x = torch.randn(6, 64, generator=g).bfloat16()
    idx = torch.stack([torch.randperm(4 * world_size, generator=g)[:2] for _ in range(6)])
    w = torch.rand(6, 2, generator=g)
    outs = []
    for make in (
        lambda: deep_ep.ElasticBuffer(dist.group.WORLD, num_max_tokens_per_rank=8, hidden=64, num_topk=2),
        lambda: deep_ep.EPBuffer(
            dist.group.WORLD, num_max_tokens_per_rank=8, hidden=64, num_topk=2, lb_allocation_plan_or_num_bytes=4096
        ),
    ):
        buffer = make()
        extra = {"defer_epilogue": True} if isinstance(buffer, deep_ep.EPBuffer) else {}
        recv_x, recv_idx, recv_w, handle, event = buffer.dispatch(x, idx, w, num_experts=4 * world_size, **extra)
        event.current_stream_wait()
        combined, _, _ = buffer.combine(recv_x * 2, handle)
        outs.append((recv_x, recv_idx, recv_w, combined))
        if extra:
            assert buffer.runtime.lb_storage.numel() == 4096
    for a, b in zip(*outs):
        assert torch.equal(a, b), "EPBuffer differs from ElasticBuffer"
    try:
        deep_ep.EPBuffer(dist.group.WORLD, lb_allocation_plan_or_num_bytes=object())
        raise AssertionError("EPBuffer took an allocator plan")
    except ValueError as e:
        assert "argument 'lb_allocation_plan_or_num_bytes' value" in str(e), str(e)
    pp = deep_ep.PPBuffer(dist.group.WORLD, 4 * 64 * 2, 2, explicitly_destroy=True)
    nxt, prev = (rank + 1) % world_size, (rank - 1) % world_size
    for i in range(3):
        pp.send(torch.full((4, 64), float(10 * rank + i)).bfloat16(), nxt)
        got = torch.empty(4, 64, dtype=torch.bfloat16)
        pp.recv(got, prev)
        assert torch.equal(got, torch.full((4, 64), float(10 * prev + i)).bfloat16()), f"pp message {i} differs"
    pp.destroy()


CHECKS = {
    "deepep_25_split": check_deepep_25_split,
    "upstream_test_ep": check_upstream_test_ep,
    # The variants take every other mode (every sixth on 4 ranks: each (handle copy, alignment, FP8, biases) once);
    # the stream and event flags in between are no-ops on CPU, and the full matrix runs once, above.
    "upstream_test_ep_no_sync_no_multiple_reduction": lambda r, w: check_upstream_test_ep(
        r, w, do_cpu_sync=0, allow_multiple_reduction=0, masked_ratio=0.2, modes_step=2
    ),
    "upstream_test_ep_deterministic_masked": lambda r, w: check_upstream_test_ep(
        r, w, deterministic=True, masked_ratio=0.3, modes_step=6
    ),
    "combine_adds_in_slot_order": check_combine_adds_in_slot_order,
    "fp8_ue8m0_packs": check_fp8_ue8m0_packs,
    "bad_input_fails_every_rank": check_bad_input_fails_every_rank,
    "experimental": check_experimental,
    "autograd_expand_gemm_combine": check_autograd_expand_gemm_combine,
    "compile_v2_moe": check_compile_v2_moe,
}


def run_check(rank: int, world_size: int, store_path: str, name: str, env: dict | None = None) -> None:
    run_named(CHECKS, rank, world_size, store_path, name, env, timeout_s=120)
