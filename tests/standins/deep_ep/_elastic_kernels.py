"""What the stand-in's V2 direct-mode kernels do (see ``_elastic_runtime`` for the model): the body of
``ElasticRuntime.dispatch`` / ``combine`` after their host checks.

``dispatch.cuh`` (sender), ``dispatch_copy_epilogue.cuh`` (receiver), ``combine.cuh`` (sender) and
``combine_reduce_epilogue.cuh`` + ``combine_utils.cuh`` (receiver), all under ``deep_ep/include/deep_ep/impls``.
"""

from __future__ import annotations

import torch

from . import _standin as S
from ._elastic_layout import (
    BF16,
    EventHandle,
    align_up,
    cdiv,
    cmod,
    garbage_sf,
    generator,
    highest_lane_mask,
    perm,
    raw_int32,
)
from ._standin import ELASTIC_HPP, check, panic


def dispatch_kernels(
    rt,
    x,
    sf,
    topk_idx,
    topk_weights,
    stats,
    cached,
    num_max,
    E,
    a,
    K,
    L,
    num_tokens,
    hidden,
    num_sf_packs,
    slots_in,
    psum_su,
    psum_e,
    unaligned,
    cached_num_recv_tokens,
    cached_num_expanded_tokens,
    cached_num_recv_tokens_per_expert_list,
    cached_recv_src_metadata,
    async_with_compute_stream,
    do_handle_copy,
    do_cpu_sync,
    do_expand,
    do_zero_padding,
    use_tma_aligned_col_major_sf,
):
    """buffer.hpp:968-1177 with the dispatch and copy-epilogue kernels."""
    R, me = rt.num_ranks, rt.rank_idx

    # ---- send (dispatch.cuh) ----------------------------------------------------------------------------------
    call = rt.dispatch_calls
    rt.dispatch_calls += 1
    problems = []
    if a <= 0:
        problems.append(f"dispatch: expert_alignment = {a}: `math::align(sum, kExpertAlignment)` divides by it")
        a = 1
    hidden_bytes = hidden * x.element_size()
    x_bytes = x.detach().reshape(num_tokens, hidden).view(torch.uint8).reshape(num_tokens, hidden_bytes)
    sf_rows = sf.detach().view(torch.int32) if sf is not None else None
    idx32 = topk_idx.detach().to(torch.int32).to(torch.int64)  # static_cast<int>(topk_idx[...])
    valid = idx32 >= 0
    if bool((valid & (idx32 >= E)).any()):
        problems.append(
            f"dispatch: rank {me}'s topk_idx holds expert {int(idx32[valid].max())} >= num_experts {E}: the notify "
            "warps count past the shared-memory expert counters and the token is stored to a peer that does not exist"
        )
    dst = torch.where(valid, torch.div(idx32, max(L, 1), rounding_mode="floor"), torch.full_like(idx32, -1))
    w_flat = topk_weights.detach().reshape(-1) if topk_weights is not None else None
    copied_topk_idx = topk_idx.detach().clone() if (do_handle_copy and not cached) else None
    per_dst_tokens, per_dst_slots = [[] for _ in range(R)], [[] for _ in range(R)]
    dst_slot = None
    if not cached:
        last = highest_lane_mask(dst, valid & (dst < R))
        dst_slot = torch.full((num_tokens, K), -1, dtype=torch.int32)
        gen = generator(call, me, 0)
        for r in range(R):
            lanes = last & (dst == r)
            toks = lanes.any(1).nonzero().view(-1)
            order = toks[perm(toks.numel(), gen)]
            slot_of = torch.empty(num_tokens, dtype=torch.int64)
            slot_of[order] = torch.arange(order.numel())
            t_i, k_i = lanes.nonzero(as_tuple=True)
            dst_slot[t_i, k_i] = (me * num_max + slot_of[t_i]).to(torch.int32)
            per_dst_tokens[r], per_dst_slots[r] = order, torch.arange(order.numel())
    else:
        slot_val = slots_in.detach().to(torch.int64)
        t_i, k_i = (slot_val >= 0).nonzero(as_tuple=True)
        for t, k in zip(t_i.tolist(), k_i.tolist(), strict=True):
            local, r = int(slot_val[t, k]) - me * num_max, int(dst[t, k])
            if not 0 <= r < R:
                problems.append(
                    f"cached dispatch: rank {me} token {t} lane {k} has buffer slot {int(slot_val[t, k])} but "
                    f"handle.topk_idx names no rank there ({int(idx32[t, k])}): a store to an invalid peer"
                )
            elif not 0 <= local < num_max:
                problems.append(
                    f"cached dispatch: rank {me} token {t} lane {k}: dst_buffer_slot_idx {int(slot_val[t, k])} is "
                    f"outside this rank's slots [{me * num_max}, {(me + 1) * num_max}) of rank {r}'s receive "
                    "buffer: it overwrites another sender's rows"
                )
            else:
                per_dst_tokens[r].append(t)
                per_dst_slots[r].append(local)
        per_dst_tokens = [torch.tensor(v, dtype=torch.int64) for v in per_dst_tokens]
        per_dst_slots = [torch.tensor(v, dtype=torch.int64) for v in per_dst_slots]
    expert_counts = torch.bincount(idx32[valid & (idx32 < E)], minlength=E)[:E] if not cached else None
    per_dst = []
    for r in range(R):
        toks = per_dst_tokens[r]
        w = None
        if w_flat is not None:
            flat = (toks.unsqueeze(1) * K + torch.arange(K)).reshape(-1)
            if flat.numel() and int(flat.max()) >= w_flat.numel():
                problems.append(
                    f"dispatch: topk_weights {tuple(topk_weights.shape)} is read as [{num_tokens}, {K}] "
                    "(`topk_weights + token_idx * kNumTopk + lane_idx`): out-of-bounds reads"
                )
                flat = flat.clamp(max=max(w_flat.numel() - 1, 0))
            w = w_flat[flat].reshape(-1, K).float() if w_flat.numel() else torch.zeros(toks.numel(), K)
        item = {
            "slots": per_dst_slots[r],
            "x": x_bytes[toks].clone(),
            "sf": sf_rows[toks].clone() if sf_rows is not None else None,
            "topk": idx32[toks].clone(),
            "w": w,
            "gidx": me * num_max + toks,
        }
        if not cached:
            item["rank_count"] = int(toks.numel())
            item["expert_counts"] = (
                expert_counts[r * L : (r + 1) * L].clone() if L else torch.zeros(0, dtype=torch.int64)
            )
        per_dst.append(item)
    meta = {
        "num_max_tokens_per_rank": num_max,
        "num_experts": E,
        "num_topk": K,
        "hidden_bytes": hidden_bytes,
        "num_sf_packs": num_sf_packs,
        "with_sf": sf is not None,
        "cached": cached,
        "with_topk_weights": topk_weights is not None,
    }
    got = rt._exchange("dispatch", meta, per_dst, problems)

    # ---- counts (notify warps / CPU sync / cached) -----------------------------------------------------------
    lo, hi = me * L, (me + 1) * L
    if not cached:
        rank_count = torch.tensor([g["rank_count"] for g in got], dtype=torch.int64)
        unaligned_counts = sum((g["expert_counts"] for g in got), torch.zeros(L, dtype=torch.int64))
        aligned = (unaligned_counts + a - 1) // a * a if a > 0 else unaligned_counts
        psum_su = rank_count.cumsum(0).to(torch.int32)
        exclusive = torch.cat([torch.zeros(1, dtype=torch.int64), aligned.cumsum(0)]).to(torch.int32)
        num_unaligned = unaligned_counts.to(torch.int32)
        if stats is not None:
            stats.add_(num_unaligned.to(stats.device))
        if do_cpu_sync:
            num_recv_tokens = int(rank_count.sum())
            per_expert_list = [int(v) for v in aligned.tolist()]
            num_expanded_tokens = sum(per_expert_list)
        else:
            num_recv_tokens = num_max * R
            num_expanded_tokens = align_up(R * num_max * min(K, L) + (a - 1) * L, a) if a > 0 else 0
            per_expert_list = []
        psum_e = exclusive[:L] if do_expand else exclusive[1:]
    else:
        num_recv_tokens = int(cached_num_recv_tokens)
        num_expanded_tokens = int(cached_num_expanded_tokens)
        per_expert_list = list(cached_num_recv_tokens_per_expert_list)
        num_unaligned = unaligned
    n_alloc = num_expanded_tokens if do_expand else num_recv_tokens

    # ---- receive (dispatch_copy_epilogue.cuh) ------------------------------------------------------------------
    psum_list = [int(v) for v in psum_su.tolist()]
    n_rows = psum_list[-1] if num_recv_tokens == num_max * R else num_recv_tokens
    src_of, slot_of = row_sources(psum_list, n_rows, num_max)
    pos = torch.full((R, num_max), -1, dtype=torch.int64)
    src_cat = torch.cat([torch.full((g["slots"].numel(),), s, dtype=torch.int64) for s, g in enumerate(got)])
    slot_cat = torch.cat([g["slots"] for g in got])
    gidx_cat = torch.cat([g["gidx"] for g in got])
    total = int(slot_cat.numel())
    for j, (s, sl) in enumerate(zip(src_cat.tolist(), slot_cat.tolist(), strict=True)):
        prev = int(pos[s, sl])
        if prev >= 0 and int(gidx_cat[prev]) != int(gidx_cat[j]):
            panic(
                f"dispatch: two tokens of rank {s} were stored into the same receive slot {sl} of rank {me} "
                "(duplicated dst_buffer_slot_idx): the result depends on timing"
            )
        pos[s, sl] = j
    if n_rows > n_alloc:
        panic(f"dispatch: {n_rows} rows to copy into {n_alloc} allocated rows of rank {me}: out-of-bounds writes")
    rows = pos[src_of, slot_of] if n_rows else torch.zeros(0, dtype=torch.int64)
    if bool((rows < 0).any()):
        i = int((rows < 0).nonzero()[0])
        panic(
            f"dispatch: rank {me}'s copy epilogue reads receive slot {int(slot_of[i])} of source rank "
            f"{int(src_of[i])} (row {i}), which no sender wrote in this dispatch (handle inconsistent with the "
            "senders' dst_buffer_slot_idx): it would copy stale buffer contents"
        )
    cat = lambda key: torch.cat([g[key] for g in got]) if total else None  # noqa: E731
    X = cat("x")[rows] if n_rows else torch.zeros(0, hidden_bytes, dtype=torch.uint8)
    SF = cat("sf")[rows] if (n_rows and sf is not None) else torch.zeros(0, num_sf_packs, dtype=torch.int32)
    TOPK = cat("topk")[rows] if n_rows else torch.zeros(0, K, dtype=torch.int64)
    W = cat("w")[rows] if (n_rows and topk_weights is not None) else torch.zeros(0, K)
    GIDX = cat("gidx")[rows] if n_rows else torch.zeros(0, dtype=torch.int64)
    in_range = (TOPK >= lo) & (TOPK < hi)
    loc = torch.where(in_range, TOPK - lo, torch.full_like(TOPK, -1))
    dup = highest_lane_mask(loc, loc >= 0) != (loc >= 0)
    if bool(dup.any()):
        i = int(dup.any(1).nonzero()[0])
        panic(
            f"dispatch: received row {i} of rank {me} selects local expert {int(loc[i][dup[i]][0])} twice: "
            "EP_DEVICE_ASSERT(ptx::deduplicate(dst_expert_idx, lane_idx) or dst_expert_idx == -1) traps "
            "(dispatch_copy_epilogue.cuh:107)"
        )
    lanes = torch.arange(K).expand_as(loc)
    master = (
        torch.where(in_range, lanes, torch.full_like(lanes, -1)).amax(1)
        if K
        else torch.zeros(n_rows, dtype=torch.int64)
    )

    recv_x = S.garbage((n_alloc, hidden), x.dtype)
    recv_sf = garbage_sf(n_alloc, num_sf_packs, sf.dtype, use_tma_aligned_col_major_sf) if sf is not None else None
    recv_topk_idx = None if do_expand else S.garbage((n_alloc, K), topk_idx.dtype)
    recv_topk_weights = None
    if topk_weights is not None:
        shape = (n_alloc,) if do_expand else (n_alloc, K)
        recv_topk_weights = S.garbage(shape, topk_weights.dtype)
    if cached:
        recv_src_metadata = cached_recv_src_metadata
    else:
        recv_src_metadata = S.garbage((num_recv_tokens, K + 2), torch.int32)
        recv_src_metadata[:n_rows, 0] = GIDX.to(torch.int32)
        recv_src_metadata[:n_rows, 1] = (src_of * K + master).to(torch.int32)
    check(psum_e.size(0) == L, f"{ELASTIC_HPP}:1123", "psum_num_recv_tokens_per_expert.size(0) == num_local_experts")
    x_out = recv_x.view(torch.uint8).view(n_alloc, hidden_bytes)
    sf_out = recv_sf.view(torch.int32) if recv_sf is not None else None
    if not do_expand:
        x_out[:n_rows] = X
        if sf_out is not None:
            sf_out[:n_rows] = SF
        recv_topk_idx[:n_rows] = loc.to(recv_topk_idx.dtype)
        if recv_topk_weights is not None:
            recv_topk_weights[:n_rows] = W
    else:
        dst_rows = expand_positions(rt, cached, n_rows, K, L, loc, recv_src_metadata, psum_e, call, n_alloc)
        r_i, k_i = (dst_rows >= 0).nonzero(as_tuple=True)
        p_i = dst_rows[r_i, k_i]
        x_out[p_i] = X[r_i]
        if sf_out is not None:
            sf_out[p_i] = SF[r_i]
        if recv_topk_weights is not None:
            recv_topk_weights[p_i] = W[r_i, k_i]
        if do_zero_padding:
            starts = torch.cat(
                [torch.zeros(1, dtype=torch.int64), ((num_unaligned.to(torch.int64) + a - 1) // a * a).cumsum(0)]
            )
            for e in range(L):
                p0, p1 = int(starts[e]) + int(num_unaligned[e]), int(starts[e + 1])
                if p1 > n_alloc:
                    panic(f"dispatch: zero padding of expert {e} writes rows [{p0}, {p1}) past {n_alloc}")
                x_out[p0:p1] = 0
                if sf_out is not None:
                    sf_out[p0:p1] = 0
                if recv_topk_weights is not None:
                    recv_topk_weights[p0:p1] = 0.0
    return (
        recv_x,
        recv_sf,
        recv_topk_idx,
        recv_topk_weights,
        copied_topk_idx,
        num_recv_tokens,
        num_expanded_tokens,
        per_expert_list,
        psum_su,
        psum_e,
        num_unaligned,
        recv_src_metadata,
        slots_in if cached else dst_slot,
        None,
        None,
        EventHandle() if async_with_compute_stream else None,
    )


def row_sources(psum: list, n_rows: int, num_max: int):
    """The copy epilogue's walk over ``psum_num_recv_tokens_per_scaleup_rank`` (dispatch_copy_epilogue.cuh:67-81):
    the source rank and slot of every received row."""
    src, slot = [], []
    current, start, end = -1, 0, 0
    for i in range(n_rows):
        while i >= end:
            current += 1
            if current >= len(psum):
                panic(
                    f"dispatch: row {i} lies past psum_num_recv_tokens_per_scaleup_rank[-1] = {psum[-1]}: "
                    "EP_DEVICE_ASSERT(current_rank_idx < kNumScaleupRanks) traps (dispatch_copy_epilogue.cuh:74)"
                )
            start, end = end, psum[current]
        if not 0 <= i - start < num_max:
            panic(
                f"dispatch: row {i} maps to slot {i - start} of source rank {current}, outside its "
                f"{num_max} receive slots: the epilogue reads another source's region"
            )
        src.append(current)
        slot.append(i - start)
    return torch.tensor(src, dtype=torch.int64), torch.tensor(slot, dtype=torch.int64)


def expand_positions(rt, cached, n_rows, K, L, loc, recv_src_metadata, psum_e, call, n_alloc):
    """The expanded row of every (received token, lane): an ``atomicAdd`` on the expert's running start in arrival
    order (a seeded shuffle), or ``recv_src_metadata[i, 2 + k]`` in cached mode. Writes the metadata columns in
    non-cached mode and advances ``psum_e`` to ``start + count``."""
    if cached:
        raw = raw_int32(recv_src_metadata)
        flat = (torch.arange(n_rows).unsqueeze(1) * (K + 2) + 2 + torch.arange(K)).reshape(-1)
        if flat.numel() and int(flat.max()) >= raw.numel():
            panic(f"cached dispatch: recv_src_metadata is read past its end ({n_rows} rows of {K + 2} ints)")
        dst_rows = raw[flat].reshape(n_rows, K) if n_rows else torch.zeros(0, K, dtype=torch.int64)
    else:
        dst_rows = torch.full((n_rows, K), -1, dtype=torch.int64)
        order = perm(n_rows, generator(call, rt.rank_idx, 1))
        loc_ord = loc[order]
        counters = psum_e.to(torch.int64).clone()
        for e in range(L):
            r_i, k_i = (loc_ord == e).nonzero(as_tuple=True)
            dst_rows[order[r_i], k_i] = int(counters[e]) + torch.arange(r_i.numel())
            counters[e] += r_i.numel()
        psum_e.copy_(counters.to(torch.int32))
        recv_src_metadata[:n_rows, 2:] = dst_rows.to(torch.int32)
    bad = dst_rows >= n_alloc  # negative entries are skipped (`kDoExpand ? (dst_tensor_idx >= 0) : ...`)
    if bool(bad.any()):
        panic(
            f"dispatch: expanded row {int(dst_rows[bad][0])} is outside the {n_alloc} allocated rows of rank "
            f"{rt.rank_idx}: out-of-bounds writes"
        )
    return dst_rows


def combine_kernels(
    rt,
    x,
    topk_weights,
    bias_0,
    bias_1,
    src_metadata,
    combined_topk_idx,
    psum,
    E,
    num_max,
    K,
    T,
    hidden,
    num_tokens,
    num_reduced,
    num_scaleup,
    expand,
    async_with_compute_stream,
):
    """buffer.hpp:1283-1342 with the combine and reduce-epilogue kernels."""
    R, me, mr = rt.num_ranks, rt.rank_idx, rt.allow_multiple_reduction

    # ---- send (combine.cuh) -----------------------------------------------------------------------------------
    rank_layout = mr and R <= K
    expanded_send = expand and not mr
    n_layout = R if rank_layout else K
    problems = []
    n_rows = num_reduced
    if num_reduced == num_max * R:
        n_rows = int(psum[-1]) if num_scaleup else 0
    meta_flat = src_metadata.detach().reshape(-1).to(torch.int64)
    if n_rows * (K + 2) > meta_flat.numel() or (not expand and n_rows > num_tokens):
        problems.append(
            f"combine: {n_rows} rows to send (psum_num_recv_tokens_per_scaleup_rank[-1]) but recv_src_metadata / x "
            f"hold {num_reduced} / {num_tokens}: out-of-bounds reads"
        )
        n_rows = min(n_rows, num_reduced, num_tokens if not expand else num_reduced)
    if expanded_send and topk_weights is not None:
        problems.append(
            "combine: expanded send (do_expand without allow_multiple_reduction) with topk_weights: "
            "EP_DEVICE_ASSERT(topk_weights == nullptr) traps (combine.cuh:69)"
        )
    xd = x.detach()
    wd = topk_weights.detach() if topk_weights is not None else None
    out = [{"layout": [], "token": [], "rows": [], "w": []} for _ in range(R)]
    for i in range(n_rows):
        m = meta_flat[i * (K + 2) : (i + 1) * (K + 2)].tolist()
        token, src_rank, src_topk = cmod(m[0], num_max), cdiv(m[1], K), cmod(m[1], K)
        if not 0 <= src_rank < R or not 0 <= token < num_max:
            problems.append(
                f"combine: recv_src_metadata row {i} of rank {me} = {m[:2]} names rank {src_rank}, token {token}: "
                "a store to an invalid peer or outside the receive buffer"
            )
            continue
        slots = m[2:] if expand else []
        valid_slots = [(k, s) for k, s in enumerate(slots) if s >= 0]
        if any(s >= num_tokens for _, s in valid_slots):
            problems.append(
                f"combine: recv_src_metadata row {i} of rank {me} names expanded rows {slots} past {num_tokens}"
            )
            continue
        if expanded_send:
            for k, s in valid_slots:
                for key, v in (("layout", k), ("token", token), ("rows", xd[s]), ("w", None)):
                    out[src_rank][key].append(v)
            continue
        if not expand:
            row = xd[i]
        elif len(valid_slots) == 1:
            row = xd[valid_slots[0][1]]
        else:  # combine_reduce: fp32 in lane order, one bf16 rounding
            acc = torch.zeros(hidden, dtype=torch.float32)
            for _, s in valid_slots:
                acc += xd[s].float()
            row = acc.to(BF16)
        w = None
        if wd is not None:
            if expand:
                w = torch.tensor([float(wd[s]) if s >= 0 else 0.0 for s in slots], dtype=torch.float32)
            else:
                w = wd[i].float()
        layout = me if rank_layout else src_topk
        for key, v in (("layout", layout), ("token", token), ("rows", row), ("w", w)):
            out[src_rank][key].append(v)
    per_dst = []
    for item in out:
        n = len(item["rows"])
        per_dst.append(
            {
                "layout": torch.tensor(item["layout"], dtype=torch.int64),
                "token": torch.tensor(item["token"], dtype=torch.int64),
                "rows": torch.stack(item["rows"]) if n else torch.zeros(0, hidden, dtype=BF16),
                "w": torch.stack(item["w"]) if (n and wd is not None and not expanded_send) else None,
            }
        )
    meta = {
        "num_max_tokens_per_rank": num_max,
        "hidden": hidden,
        "num_topk": K,
        "num_experts": E,
        "with_topk_weights": topk_weights is not None,
        "use_expanded_layout": expand,
        "allow_multiple_reduction": mr,
    }
    got = rt._exchange("combine", meta, per_dst, problems)

    # ---- receive and reduce (combine_reduce_epilogue.cuh) ----------------------------------------------------
    pos = torch.full((n_layout * num_max,), -1, dtype=torch.int64)
    rows = torch.cat([g["rows"] for g in got])
    w_rows = torch.cat([g["w"] for g in got if g["w"] is not None]) if topk_weights is not None else None
    senders = [s for s, g in enumerate(got) for _ in range(g["rows"].size(0))]
    lay_cat = torch.cat([g["layout"] for g in got]).tolist()
    tok_cat = torch.cat([g["token"] for g in got]).tolist()
    for j, (lay, tok) in enumerate(zip(lay_cat, tok_cat, strict=True)):
        if not 0 <= lay < n_layout:
            panic(f"combine: rank {senders[j]} stores into layout row {lay} of rank {me}'s {n_layout}-row buffer")
        key = lay * num_max + tok
        prev = int(pos[key])
        if prev >= 0 and not torch.equal(rows[prev].view(torch.int16), rows[j].view(torch.int16)):
            panic(
                f"combine: two different rows land in slot (layout {lay}, token {tok}) of rank {me}: the result "
                "would depend on timing"
            )
        pos[key] = j
    idx32 = combined_topk_idx.detach().to(torch.int32).to(torch.int64)
    L = E // R
    if bool((idx32 >= E).any()):
        panic(f"combine: handle.topk_idx of rank {me} holds expert {int(idx32.max())} >= {E}: out-of-bounds reads")
    dst = torch.where(idx32 >= 0, torch.div(idx32, max(L, 1), rounding_mode="floor"), torch.full_like(idx32, -1))
    valid = dst >= 0
    use = valid if expanded_send else highest_lane_mask(dst, valid)
    lanes = torch.arange(K).expand(T, K)
    layout = dst if rank_layout else lanes
    keys = layout * num_max + torch.arange(T).unsqueeze(1)
    p = torch.where(
        use, pos[keys.clamp(0, max(pos.numel() - 1, 0))] if pos.numel() else keys, torch.full_like(keys, -1)
    )
    missing = use & (p < 0)
    if bool(missing.any()):
        t, k = (int(v) for v in missing.nonzero()[0])
        panic(
            f"combine: token {t} of rank {me} expects rank {int(dst[t, k])}'s row in slot (layout {int(layout[t, k])}, "
            f"token {t}), but none was written in this combine (handle inconsistent with the dispatch): the reduce "
            "epilogue would read stale buffer contents"
        )
    acc = torch.zeros(T, hidden, dtype=torch.float32)
    for b in (bias_0, bias_1):
        if b is not None:
            acc += b.detach().float()
    for k in range(K):
        sel = use[:, k]
        if bool(sel.any()):
            acc[sel] += rows[p[sel, k]].float()
    combined_x = acc.to(BF16)
    combined_topk_weights = None
    if topk_weights is not None:
        master_lane = torch.where(
            dst.unsqueeze(2) == dst.unsqueeze(1), lanes.unsqueeze(1).expand(T, K, K), torch.full((T, K, K), -1)
        ).amax(2)
        src_layout = dst if rank_layout else master_lane
        wp = pos[(src_layout * num_max + torch.arange(T).unsqueeze(1)).clamp(0, max(pos.numel() - 1, 0))]
        combined_topk_weights = torch.zeros(T, K, dtype=topk_weights.dtype)
        for k in range(K):
            sel = valid[:, k]
            if bool(sel.any()):
                if bool((wp[sel, k] < 0).any()):
                    panic(f"combine: a top-k weight slot of rank {me} was not written in this combine")
                combined_topk_weights[sel, k] = w_rows[wp[sel, k], k]
    return combined_x, combined_topk_weights, (EventHandle() if async_with_compute_stream else None)
