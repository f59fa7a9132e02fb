"""Self-checks of the CPU stand-in for ``deep_ep`` (``tests/standins/deep_ep``) on each rank of spawned gloo
processes (tests/upstream/test_deep_ep_standin.py): one spawn per world size runs every check below in order.

Every expectation is computed here, independently of the stand-in's code: from an ``all_gather_object`` of every
rank's inputs, with plain loops (channel split ``t // ceil(T / C)``, per-queue running indices, source-rank-major
order), per-row values that any rank can regenerate (``_value``), and its own FP8 / FMA arithmetic.
"""

from __future__ import annotations

import math
import struct

import torch
import torch.distributed as dist

from tests.distributed import run_named

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
HIDDEN = 64
LL_HIDDEN = 2048


# ---------------------------------------------------------------------------------------------------------------------
# Helpers (independent of the stand-in)
# ---------------------------------------------------------------------------------------------------------------------


def gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def any_rank(flag: bool) -> bool:
    t = torch.tensor([1 if flag else 0])
    dist.all_reduce(t)
    return int(t) > 0


def routing(rank: int, num_tokens: int, num_topk: int, num_experts: int, seed: int):
    """Distinct experts per token, ~25% of slots -1, token 0 routed nowhere."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    idx = torch.argsort(torch.rand(num_tokens, num_experts, generator=g), dim=1)[:, :num_topk].contiguous()
    idx = idx.masked_fill(torch.rand(num_tokens, num_topk, generator=g) < 0.25, -1)
    if num_tokens:
        idx[0] = -1
    x = torch.randn(num_tokens, HIDDEN, generator=g).to(BF16)
    w = torch.rand(num_tokens, num_topk, generator=g) + 0.5
    return x, idx.contiguous(), w


def _value(*key, hidden=HIDDEN) -> torch.Tensor:
    """A bf16 row any rank can regenerate from its key (e.g. (dst rank, src rank, src token))."""
    phase = sum((i + 1) * 0.7311 * k for i, k in enumerate(key))
    return torch.sin(torch.arange(hidden, dtype=torch.float64) * 0.37 + phase).mul(3).to(BF16)


def raises(fn, exc=RuntimeError, words=None):
    try:
        fn()
    except exc as e:
        text = str(e)
        for w in [words] if isinstance(words, str) else words or []:
            assert w in text, f"{w!r} not in {text!r}"
        return e
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def expected_receive(me, world, xs, idxs, ws, num_local):
    """Rows ``me`` must receive: (src rank, src token) for every token with an expert here, source-rank-major."""
    lo, hi = me * num_local, (me + 1) * num_local
    pairs, rows, topk, weights = [], [], [], []
    for s in range(world):
        for t in range(idxs[s].size(0)):
            experts = idxs[s][t].tolist()
            if any(lo <= e < hi for e in experts):
                pairs.append((s, t))
                rows.append(xs[s][t])
                topk.append([e - lo if lo <= e < hi else -1 for e in experts])
                weights.append([ws[s][t, k].item() if lo <= e < hi else 0.0 for k, e in enumerate(experts)])
    return pairs, rows, topk, weights


def handle_expectations(me, world, itrs, num_channels):
    """(channel_prefix_matrix of ``me`` as sender, recv_channel_prefix_matrix of ``me``, send_head of ``me``)."""

    def counts(s, dst):
        tokens = itrs[s].size(0)
        per = math.ceil(tokens / num_channels) if tokens else 1
        c = [0] * num_channels
        for t in range(tokens):
            if itrs[s][t, dst]:
                c[t // per] += 1
        return c

    cpm = []
    for dst in range(world):
        running, row = 0, []
        for n in counts(me, dst):
            running += n
            row.append(running)
        cpm.append(row)
    rcpm = []
    for s in range(world):
        running, row = 0, []
        for n in counts(s, me):
            row.append(running)
            running += n
        rcpm.append(row)
    tokens = itrs[me].size(0)
    per = math.ceil(tokens / num_channels) if tokens else 1
    head = []
    for t in range(tokens):
        row = []
        for dst in range(world):
            if itrs[me][t, dst]:
                row.append(sum(1 for u in range((t // per) * per, t) if itrs[me][u, dst]))
            else:
                row.append(-1)
        head.append(row)
    return cpm, rcpm, head


def fp8_reference(x: torch.Tensor, round_scale: bool):
    """Per token and 128 channels: amax floored at 1e-4, scale = 448 / amax, scale_inv = amax * fp32(1/448), or
    powers of two; fp8 = satfinite(x * scale). Written with Python floats rounded through struct."""

    def f32(v):
        return struct.unpack("f", struct.pack("f", v))[0]

    t, h = x.shape
    xf = x.float()
    data = torch.empty(t, h, dtype=torch.float32)
    inv = torch.empty(t, h // 128, dtype=torch.float32)
    for i in range(t):
        for gi in range(h // 128):
            block = xf[i, gi * 128 : (gi + 1) * 128]
            amax = max(f32(1e-4), float(block.abs().max()))
            prod = f32(amax * f32(1 / 448.0))
            if round_scale:
                e = math.ceil(math.log2(prod))
                scale, scale_inv = 2.0**-e, 2.0**e
            else:
                scale, scale_inv = f32(448.0 / amax), prod
            data[i, gi * 128 : (gi + 1) * 128] = (block * torch.tensor(scale, dtype=torch.float32)).clamp(-448, 448)
            inv[i, gi] = scale_inv
    return data.to(FP8), inv


# ---------------------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------------------


def check_layout(deep_ep, rank, world):
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e8))
    experts = 3 * world
    _, idx, _ = routing(rank, 9 + rank, 3, experts, seed=1)
    idx[1, 2] = idx[1, 1] if idx[1, 1] >= 0 else 0  # a duplicated expert: counted twice per expert, once per rank
    idx[2, 0] = experts + 5  # ids >= num_experts are ignored by the layout kernel
    per_rank, per_rdma, per_expert, in_rank, event = buffer.get_dispatch_layout(idx, experts)
    assert per_rdma is None and isinstance(event, deep_ep.EventOverlap) and event.event is None
    exp_expert = [sum(int(v == e) for v in idx.view(-1).tolist()) for e in range(experts)]
    exp_in_rank = [[any(0 <= e < experts and e // 3 == r for e in row) for r in range(world)] for row in idx.tolist()]
    assert per_expert.dtype == torch.int32 and per_expert.tolist() == exp_expert
    assert in_rank.dtype == torch.bool and in_rank.tolist() == exp_in_rank
    assert per_rank.dtype == torch.int32 and per_rank.tolist() == [sum(r[j] for r in exp_in_rank) for j in range(world)]
    _, _, _, _, event = buffer.get_dispatch_layout(idx, experts, async_finish=True)
    assert event.event is not None
    event.current_stream_wait()


def check_dispatch_and_handle(deep_ep, rank, world):
    """Rows and order, top-k rules, the per-expert list with alignment, and every handle entry."""
    experts, num_local = 2 * world, 2
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e8))
    x, idx, w = routing(rank, 17 + 5 * rank, 3, experts, seed=2)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    xs, idxs, ws, itrs = zip(*gather((x, idx, w, in_rank)))
    pairs, rows, topk, weights = expected_receive(rank, world, xs, idxs, ws, num_local)
    for alignment, config in ((1, None), (4, deep_ep.Config(6, 4, 32))):
        recv_x, recv_idx, recv_w, counts, handle, event = buffer.dispatch(
            x,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=w,
            expert_alignment=alignment,
            config=config,
        )
        assert event.event is None
        assert recv_x.shape == (len(pairs), HIDDEN) and recv_x.dtype == BF16
        assert torch.equal(recv_x.view(torch.int16), torch.stack(rows).view(torch.int16))
        assert recv_idx.dtype == torch.int64 and recv_idx.tolist() == topk
        assert recv_w.dtype == torch.float32 and recv_w.tolist() == weights
        raw = [
            sum(sum(int(e == rank * num_local + i) for e in idxs[s].view(-1).tolist()) for s in range(world))
            for i in range(num_local)
        ]
        assert counts == [math.ceil(n / alignment) * alignment for n in raw], (counts, raw)
        rank_prefix, cpm, rcpm, src_idx, itr, head = handle
        assert itr is in_rank
        incoming = [int(itrs[s][:, rank].sum()) for s in range(world)]
        assert rank_prefix.shape == (world, world) and rank_prefix.dtype == torch.int32
        assert rank_prefix[:, rank].tolist() == [sum(incoming[: s + 1]) for s in range(world)]
        num_channels = (20 if config is None else 6) // 2
        exp_cpm, exp_rcpm, exp_head = handle_expectations(rank, world, itrs, num_channels)
        assert cpm.shape == (world, num_channels) and cpm.tolist() == exp_cpm
        assert rcpm.tolist() == exp_rcpm
        assert head.dtype == torch.int32 and head.tolist() == exp_head
        assert src_idx.dtype == torch.int32 and src_idx.tolist() == [t for _, t in pairs]

    # without top-k: only x moves; the list still counts per local expert
    recv_x, recv_idx, recv_w, counts, handle, _ = buffer.dispatch(
        x, num_tokens_per_rank=per_rank, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert
    )
    assert recv_idx is None and recv_w is None and counts == raw
    assert torch.equal(recv_x.view(torch.int16), torch.stack(rows).view(torch.int16))

    # cached dispatch: the same routing for new data, bitwise; handle and list are None
    x2 = (x.float() * 3 + 1).to(BF16)
    x2s = gather(x2)
    again, none_idx, none_w, none_list, none_handle, _ = buffer.dispatch(x2, handle=handle)
    assert none_idx is None and none_w is None and none_list is None and none_handle is None
    assert torch.equal(again.view(torch.int16), torch.stack([x2s[s][t] for s, t in pairs]).view(torch.int16))


def check_worst_tokens(deep_ep, rank, world):
    experts = 2 * world
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e8))
    x, idx, w = routing(rank, 11 + rank, 2, experts, seed=3)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    compact = buffer.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    n = compact[0].size(0)
    worst = 11 * world + world * world
    padded = buffer.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
        num_worst_tokens=worst,
    )
    recv_x, recv_idx, recv_w, counts, handle, _ = padded
    assert counts == [] and recv_x.shape == (worst, HIDDEN) and handle[3].shape == (worst,)
    assert torch.equal(recv_x[:n].view(torch.int16), compact[0].view(torch.int16))
    assert torch.equal(recv_idx[:n], compact[1]) and torch.equal(recv_w[:n], compact[2])
    assert torch.equal(handle[3][:n], compact[4][3])
    assert bool((recv_idx[n:] == -1).all())
    # rows the kernel never writes are uninitialized, never zeros: the stand-in's garbage is NaN
    assert bool(recv_x[n:].isnan().all()) and bool(recv_w[n:].isnan().all())
    # combine with the padded handle: rows past n are never read
    y = torch.cat([compact[0], torch.full((worst - n, HIDDEN), 7.0, dtype=BF16)])
    a = buffer.combine(compact[0], compact[4])[0]
    b = buffer.combine(y, handle)[0]
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


def check_fp8(deep_ep, rank, world):
    experts = 2 * world
    hidden = 256
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e8))
    _, idx, w = routing(rank, 10 + rank, 2, experts, seed=4)
    g = torch.Generator().manual_seed(40 + rank)
    data = (torch.randn(idx.size(0), hidden, generator=g) * 4).to(FP8)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    datas, idxs, ws = zip(*gather((data.view(torch.uint8), idx, w)))  # FP8 tensors do not pickle
    pairs, *_ = expected_receive(rank, world, datas, idxs, ws, 2)
    for dtype in (torch.float32, torch.int32):
        col_major = torch.randn(hidden // 128, idx.size(0), generator=g).t()  # strided, as upstream's test passes
        scales = col_major if dtype == torch.float32 else col_major.view(torch.int32)
        all_scales = gather(scales.contiguous())
        (recv, recv_sf), recv_idx, _, _, handle, _ = buffer.dispatch(
            (data, scales),
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=w,
        )
        assert recv.dtype == FP8 and recv_sf.dtype == dtype and recv_sf.is_contiguous()
        assert recv_sf.shape == (len(pairs), hidden // 128)
        assert torch.equal(recv.view(torch.uint8), torch.stack([datas[s][t] for s, t in pairs]))
        assert torch.equal(
            recv_sf.view(torch.int32), torch.stack([all_scales[s][t] for s, t in pairs]).view(torch.int32)
        )
        (cached, cached_sf), *_ = buffer.dispatch((data, scales), handle=handle)
        assert torch.equal(cached.view(torch.uint8), recv.view(torch.uint8)) and torch.equal(cached_sf, recv_sf)


def _combine_reference(rank, world, itr, biases, weights_of):
    """bf16(fp32(b0) + fp32(b1) + sum over ranks ascending of fp32(row)) and the summed weights."""
    tokens = itr.size(0)
    out = torch.empty(tokens, HIDDEN, dtype=BF16)
    out_w = []
    for t in range(tokens):
        acc = torch.zeros(HIDDEN, dtype=torch.float32)
        acc = acc + (biases[0][t].float() if biases[0] is not None else torch.zeros(HIDDEN))
        acc = acc + (biases[1][t].float() if biases[1] is not None else torch.zeros(HIDDEN))
        wsum = torch.zeros(3, dtype=torch.float32)
        for r in range(world):
            if itr[t, r]:
                acc = acc + _value(r, rank, t).float()
                wsum = wsum + weights_of(r, rank, t)
        out[t] = acc.to(BF16)
        out_w.append(wsum)
    return out, torch.stack(out_w)


def check_combine(deep_ep, rank, world):
    """Bitwise against the reference with 0, 1 and 2 biases; weights summed over the returning copies."""
    experts = 2 * world
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e8))
    x, idx, w = routing(rank, 21 + 2 * rank, 3, experts, seed=5)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    _, _, recv_w, _, handle, _ = buffer.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    src_rank = []
    prefix = handle[0][:, rank].tolist()
    for s in range(world):
        src_rank += [s] * (prefix[s] - (prefix[s - 1] if s else 0))
    y = (
        torch.stack([_value(rank, s, t) for s, t in zip(src_rank, handle[3].tolist())])
        if src_rank
        else torch.empty(0, HIDDEN, dtype=BF16)
    )

    def weights_of(r, s, t):
        return torch.tensor([0.25 * r + 0.01 * k + 0.001 * t + s for k in range(3)], dtype=torch.float32)

    yw = (
        torch.stack([weights_of(rank, s, t) for s, t in zip(src_rank, handle[3].tolist())])
        if src_rank
        else torch.empty(0, 3)
    )
    g = torch.Generator().manual_seed(50 + rank)
    b0 = torch.randn(idx.size(0), HIDDEN, generator=g).to(BF16)
    b1 = torch.randn(idx.size(0), HIDDEN, generator=g).to(BF16)
    for bias in (None, b0, (b0, b1)):
        combined, combined_w, event = buffer.combine(y, handle, topk_weights=yw, bias=bias, async_finish=True)
        with event:
            pass
        pair = (bias, None) if isinstance(bias, torch.Tensor) else (bias or (None, None))
        ref, ref_w = _combine_reference(rank, world, in_rank, pair, weights_of)
        assert combined.dtype == BF16 and torch.equal(combined.view(torch.int16), ref.view(torch.int16))
        assert torch.equal(combined_w, ref_w)
    # summation order probe: fp32 cancellation that only the documented order (biases first, then ranks ascending)
    # turns into 0. Lowest destination sends +2^24, highest -2^24 (weights: the second lowest also sends 1.0)
    itrs = gather(in_rank)
    big = float(2**24)

    def probe(s, t, pos_of=None):
        dests = [r for r in range(world) if itrs[s][t, r]]
        pos = dests.index(rank)
        if len(dests) == 1:
            return 3.0, 3.0
        x_val = big if pos == 0 else (-big if pos == len(dests) - 1 else 0.0)
        w_val = big if pos == 0 else (-big if pos == len(dests) - 1 else (1.0 if pos == 1 else 0.0))
        return x_val, w_val

    vals = [probe(s, t) for s, t in zip(src_rank, handle[3].tolist())]
    y_probe = torch.tensor([[v] * HIDDEN for v, _ in vals], dtype=BF16).reshape(-1, HIDDEN)
    w_probe = torch.tensor([[u] * 3 for _, u in vals], dtype=torch.float32).reshape(-1, 3)
    half = torch.full((idx.size(0), HIDDEN), 0.5, dtype=BF16)
    combined, combined_w, _ = buffer.combine(y_probe, handle, topk_weights=w_probe, bias=(half, half))
    fanout = in_rank.sum(1)
    exp_x = torch.where(fanout == 0, 1.0, torch.where(fanout == 1, 4.0, 0.0))
    exp_w = torch.where(fanout == 1, 3.0, 0.0)
    assert torch.equal(combined.float(), exp_x.unsqueeze(1).expand(-1, HIDDEN)), (combined[:, 0], fanout)
    assert torch.equal(combined_w, exp_w.unsqueeze(1).expand(-1, 3)), (combined_w[:, 0], fanout)
    # feeding the received weights back returns the original ones (zero at -1 slots), bitwise
    _, back, _ = buffer.combine(y, handle, topk_weights=recv_w)
    assert torch.equal(back, w.masked_fill(idx < 0, 0.0))
    # cached_notify_combine rewrote the -1 entries of send_head in place: -(next sent head in the channel) - 1
    _, _, original = handle_expectations(rank, world, gather(in_rank), 10)
    per = math.ceil(idx.size(0) / 10)
    rewritten = [row[:] for row in original]
    for t in range(len(original)):
        for r in range(world):
            if original[t][r] < 0:
                later = [original[u][r] for u in range(t + 1, (t // per + 1) * per) if u < len(original)]
                nxt = next((h for h in later if h >= 0), 1 << 25)
                rewritten[t][r] = -nxt - 1
    assert handle[5].tolist() == rewritten


def _routed_combine(deep_ep, buffer, rank, world, seed, mutate=None):
    """Dispatch, build routing-dependent expert outputs, mutate the handle on rank 1, combine. Returns
    ('ok' | 'wrong' | 'panic' | 'strict', message)."""
    experts = 2 * world
    x, idx, w = routing(rank, 24, 2, experts, seed=seed)
    idx[1:] = torch.where(idx[1:] < 0, (idx[1:] + rank + 1) % experts, idx[1:])  # most tokens go somewhere
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    _, _, _, _, handle, _ = buffer.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    prefix = handle[0][:, rank].tolist()
    src_rank = []
    for s in range(world):
        src_rank += [s] * (prefix[s] - (prefix[s - 1] if s else 0))
    y = torch.stack([_value(rank, s, t) for s, t in zip(src_rank, handle[3].tolist())])
    handle = tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in handle)
    if mutate is not None and rank == 1:
        handle = mutate(handle, in_rank)
    ref, _ = _combine_reference(rank, world, in_rank, (None, None), lambda *a: torch.zeros(3))
    try:
        out, _, _ = buffer.combine(y, handle)
    except deep_ep._standin.StrictHandleError as e:
        return "strict", str(e)
    except deep_ep._standin.Panic as e:
        return "panic", str(e)
    return ("ok" if torch.equal(out.view(torch.int16), ref.view(torch.int16)) else "wrong"), ""


def check_mutations(deep_ep, rank, world):
    """A corrupted send_head / recv_src_idx / rank_prefix_matrix never gives the right answer silently."""
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e8))

    def head_too_far(handle, itr):
        head = handle[5]
        t, r = [int(v) for v in (head >= 0).nonzero()[-1]]
        head[t, r] = 1000
        return handle

    def head_swapped(handle, itr):
        head = handle[5]
        for r in range(head.size(1)):  # two sent tokens of one channel toward r (10 channels of 3 tokens)
            for c in range(10):
                sent = [t for t in range(3 * c, min(3 * c + 3, head.size(0))) if head[t, r] >= 0]
                if len(sent) >= 2:
                    a, b = sent[:2]
                    head[a, r], head[b, r] = int(head[b, r]), int(head[a, r])
                    return handle
        raise AssertionError("no channel with two tokens")

    def src_idx_swapped(handle, itr):
        src = handle[3]
        assert int(src[0]) != int(src[1])
        src[0], src[1] = int(src[1]), int(src[0])
        return handle

    def rank_prefix_shifted(handle, itr):
        handle[0][0, 1] += 1
        return handle

    outcomes = {}
    for name, mutate in (
        ("none", None),
        ("head_too_far", head_too_far),
        ("head_swapped", head_swapped),
        ("src_idx_swapped", src_idx_swapped),
        ("rank_prefix_shifted", rank_prefix_shifted),
    ):
        outcomes[name] = gather(_routed_combine(deep_ep, buffer, rank, world, 6, mutate))
    assert all(o == "ok" for o, _ in outcomes["none"]), outcomes["none"]
    for name in ("head_too_far", "head_swapped", "src_idx_swapped", "rank_prefix_shifted"):
        assert any(o != "ok" for o, _ in outcomes[name]), (name, outcomes[name])
    assert outcomes["head_too_far"][1][0] == "panic" and "waits forever" in outcomes["head_too_far"][1][1]
    assert any(o == "strict" for o, _ in outcomes["src_idx_swapped"])

    # imitating upstream exactly: recv_src_idx is never read, a swapped send_head gives a wrong result
    deep_ep._standin.configure(strict_handle=False)
    try:
        loose = gather(_routed_combine(deep_ep, buffer, rank, world, 6, src_idx_swapped))
        assert all(o == "ok" for o, _ in loose), loose
        loose = gather(_routed_combine(deep_ep, buffer, rank, world, 6, head_swapped))
        assert loose[1][0] == "wrong", loose
    finally:
        deep_ep._standin.configure()

    # a cached dispatch whose channel_prefix_matrix disagrees with is_token_in_rank hangs upstream: Panic
    experts = 2 * world
    x, idx, w = routing(rank, 24, 2, experts, seed=7)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    handle = buffer.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )[4]
    bad = list(handle)
    bad[1] = handle[1].clone()
    if rank == 0:
        bad[1][1, -1] += 1  # rank 0 announces one more token to rank 1
    outcome = "ok"
    try:
        buffer.dispatch(x, handle=tuple(bad))
    except deep_ep._standin.Panic as e:
        outcome = str(e)
    outcomes = gather(outcome)
    assert "announces" in outcomes[1] and outcomes[0] == "ok", outcomes


def check_host_asserts(deep_ep, rank, world):
    """Upstream's host checks fire with upstream's words (identical bad input on every rank)."""
    experts = 2 * world
    buffer = deep_ep.Buffer(dist.group.WORLD, int(1e8))
    x, idx, w = routing(rank, 8, 2, experts, seed=8)
    per_rank, _, per_expert, in_rank, _ = buffer.get_dispatch_layout(idx, experts)
    kw = {"num_tokens_per_rank": per_rank, "is_token_in_rank": in_rank, "num_tokens_per_expert": per_expert}
    raises(
        lambda: buffer.dispatch(x.t().contiguous().t(), **kw),
        words=["Assertion exception (csrc/legacy/buffer.hpp:457): x.dim() == 2 and x.is_contiguous()"],
    )
    raises(
        lambda: buffer.dispatch(x, topk_idx=idx, **kw),
        words="(csrc/legacy/buffer.hpp:481): topk_idx.has_value() == topk_weights.has_value()",
    )
    raises(
        lambda: buffer.dispatch(x, topk_idx=idx.int(), topk_weights=w, **kw),
        words="expected scalar type Long but found Int",
    )
    raises(
        lambda: buffer.dispatch(x, allocate_on_comm_stream=True, **kw),
        words="(csrc/legacy/buffer.hpp:512): previous_event.has_value() and async",
    )
    raises(
        lambda: buffer.dispatch((x, torch.ones(8, 1)), **kw),
        words="(csrc/legacy/buffer.hpp:498): x.element_size() == 1",
    )
    recv_x, _, _, _, handle, _ = buffer.dispatch(x, topk_idx=idx, topk_weights=w, **kw)
    raises(lambda: buffer.dispatch(x, handle=handle, topk_idx=idx), AssertionError)
    raises(
        lambda: buffer.dispatch(x, handle=handle, config=deep_ep.Config(8, 6, 256)),
        words="(csrc/legacy/buffer.hpp:465): cached_channel_prefix_matrix->size(0) == num_ranks and "
        "cached_channel_prefix_matrix->size(1) == num_channels",
    )
    raises(
        lambda: buffer.combine(recv_x.float(), handle),
        words='(csrc/kernels/legacy/launch.cuh:109): false and "Unsupported type"',
    )
    raises(
        lambda: buffer.combine(recv_x, handle, config=deep_ep.Config(8, 6, 256)),
        words="(csrc/legacy/buffer.hpp:749): channel_prefix_matrix.size(0) == num_ranks and "
        "channel_prefix_matrix.size(1) == num_channels",
    )
    raises(lambda: buffer.combine(recv_x, handle, bias=(x, x, x)), AssertionError)
    raises(
        lambda: buffer.combine(recv_x, handle, bias=x[:-1].contiguous()),
        words="(csrc/legacy/buffer.hpp:801): bias.size(0) == num_recv_tokens and bias.size(1) == hidden",
    )
    raises(buffer.destroy, AssertionError, "`explicitly_destroy` flag must be set")
    raises(lambda: deep_ep.Buffer(dist.group.WORLD, 100), words="(csrc/legacy/buffer.hpp:107)")
    raises(
        lambda: deep_ep.Buffer(dist.group.WORLD, 0, 1024),
        words="(csrc/legacy/buffer.hpp:116): num_ranks > LEGACY_NUM_MAX_NVL_PEERS or low_latency_mode",
    )
    # a normal-mode buffer has no NVSHMEM, so upstream's Python trips over the missing attribute
    raises(lambda: buffer.low_latency_dispatch(x, idx, 8, experts), AttributeError, "nvshmem_qp_depth")
    raises(
        lambda: buffer.clean_low_latency_buffer(8, LL_HIDDEN, experts),
        words="(csrc/legacy/buffer.hpp:1432): low_latency_mode",
    )
    explicit = deep_ep.Buffer(dist.group.WORLD, 2**20, explicitly_destroy=True)
    explicit.destroy()
    assert explicit.runtime is None


def check_undersized_buffers(deep_ep, rank, world):
    """Buffers smaller than a call needs: upstream's host checks catch them (no Panic needed)."""
    experts = 2 * world
    x, idx, w = routing(rank, 8, 2, experts, seed=9)
    config = deep_ep.Buffer.get_dispatch_config(world)
    hint = config.get_nvl_buffer_size_hint(HIDDEN * 2, world)
    small = deep_ep.Buffer(dist.group.WORLD, 128 * 64)
    per_rank, _, per_expert, in_rank, _ = small.get_dispatch_layout(idx, experts)
    raises(
        lambda: small.dispatch(
            x,
            num_tokens_per_rank=per_rank,
            is_token_in_rank=in_rank,
            num_tokens_per_expert=per_expert,
            topk_idx=idx,
            topk_weights=w,
        ),
        words="(csrc/legacy/buffer.hpp:627)",
    )
    exact = deep_ep.Buffer(dist.group.WORLD, hint)
    exact.dispatch(
        x,
        num_tokens_per_rank=per_rank,
        is_token_in_rank=in_rank,
        num_tokens_per_expert=per_expert,
        topk_idx=idx,
        topk_weights=w,
    )
    ll_hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(8, LL_HIDDEN, world, experts)
    ll_small = deep_ep.Buffer(dist.group.WORLD, 0, ll_hint - 1024, low_latency_mode=True, num_qps_per_rank=2)
    xl = torch.zeros(4, LL_HIDDEN, dtype=BF16)
    raises(
        lambda: ll_small.low_latency_dispatch(xl, idx[:4].contiguous(), 8, experts),
        words="(csrc/legacy/buffer.hpp:1503): layout.total_bytes <= num_rdma_bytes",
    )
    # too few QPs for the local experts: the kernel traps on the device
    few_qps = deep_ep.Buffer(dist.group.WORLD, 0, ll_hint, low_latency_mode=True, num_qps_per_rank=1)
    raises(
        lambda: few_qps.low_latency_dispatch(xl, idx[:4].contiguous(), 8, experts),
        deep_ep._standin.Panic,
        "num_rc_per_pe >= num_local_experts",
    )


def _ll_reference_rows(rank, world, idxs, num_local):
    """For each local expert: the sorted list of (src rank, src token) pairs, one per selecting slot."""
    lists = []
    for i in range(num_local):
        e = rank * num_local + i
        lists.append(
            sorted((s, t) for s in range(world) for t, row in enumerate(idxs[s].tolist()) for v in row if v == e)
        )
    return lists


def check_low_latency(deep_ep, rank, world):
    experts, num_local, t_max = 2 * world, 2, 8
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(t_max, LL_HIDDEN, world, experts)
    buffer = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=num_local)
    g = torch.Generator().manual_seed(60 + rank)
    tokens = 5 + rank % 3
    idx = torch.argsort(torch.rand(tokens, experts, generator=g), dim=1)[:, :3].contiguous()
    idx[0, 1] = -1
    x = (torch.randn(tokens, LL_HIDDEN, generator=g) * 2).to(BF16)
    w = torch.rand(tokens, 3, generator=g)
    xs, idxs = zip(*gather((x, idx)))
    expected = _ll_reference_rows(rank, world, idxs, num_local)
    shuffled = False
    for use_fp8, round_scale, ue8m0, hook_mode in (
        (False, False, False, False),
        (True, False, False, True),
        (True, True, False, False),
        (True, True, True, False),
    ):
        stats = torch.zeros(num_local, dtype=torch.int32)
        recv, count, handle, event, hook = buffer.low_latency_dispatch(
            x,
            idx,
            t_max,
            experts,
            cumulative_local_expert_recv_stats=stats,
            use_fp8=use_fp8,
            round_scale=round_scale,
            use_ue8m0=ue8m0,
            async_finish=not hook_mode,
            return_recv_hook=hook_mode,
        )
        data, sf = recv if use_fp8 else (recv, None)
        assert data.shape == (num_local, world * t_max, LL_HIDDEN) and data.dtype == (FP8 if use_fp8 else BF16)
        if hook_mode:
            assert event.event is None and count.tolist() == [0] * num_local and stats.tolist() == [0] * num_local
            hook()
        else:
            assert hook is None and event.event is not None and event.extra_tensors is not None
        src_info, layout_range, h_tmax, h_hidden, h_experts = handle
        assert (h_tmax, h_hidden, h_experts) == (t_max, LL_HIDDEN, experts)
        assert count.tolist() == [len(e) for e in expected] == stats.tolist()
        if use_fp8:
            groups = LL_HIDDEN // (512 if ue8m0 else 128)
            assert sf.shape == (num_local, world * t_max, groups) and sf.dtype == (
                torch.int32 if ue8m0 else torch.float32
            )
            assert sf.stride() == (groups * world * t_max, 1, world * t_max)
        for i in range(num_local):
            got = []
            covered = []
            for s in range(world):
                packed = int(layout_range[i, s])
                begin, n = packed >> 32, packed & 0xFFFFFFFF
                covered += list(range(begin, begin + n))
                seg = src_info[i, begin : begin + n].tolist()
                shuffled |= seg != sorted(seg)
                got += [(s, t) for t in seg]
                for j, t in zip(range(begin, begin + n), seg):
                    if not use_fp8:
                        assert torch.equal(data[i, j].view(torch.int16), xs[s][t].view(torch.int16))
                    else:
                        ref, inv = fp8_reference(xs[s][t : t + 1], round_scale)
                        assert torch.equal(data[i, j].view(torch.uint8), ref[0].view(torch.uint8)), (i, j)
                        if ue8m0:
                            exps = ((inv[0].view(torch.int32) >> 23) & 0xFF).tolist()
                            packs = [sum(exps[4 * p + k] << (8 * k) for k in range(4)) for p in range(groups)]
                            assert [v & 0xFFFFFFFF for v in sf[i, j].tolist()] == packs
                        else:
                            assert torch.equal(sf[i, j], inv[0])
            begins = [int(layout_range[i, s]) >> 32 for s in range(world)]
            shuffled |= begins != sorted(begins)
            assert sorted(covered) == list(range(len(expected[i])))
            assert sorted(got) == expected[i]
            if not use_fp8:
                assert bool(data[i, len(expected[i]) :].isnan().all())  # unused rows: garbage, not zeros
    if deep_ep._standin.STATE.ll_shuffle_seed is not None:
        assert any_rank(shuffled), "the seeded shuffle never changed an order"

    # combine: expert outputs that depend on (expert, src rank, token); weighted sum in slot order (FP32 FMA)
    recv, count, handle, _, _ = buffer.low_latency_dispatch(x, idx, t_max, experts, use_fp8=False)
    src_info, layout_range = handle[0], handle[1]
    y = torch.zeros(num_local, world * t_max, LL_HIDDEN, dtype=BF16)
    for i in range(num_local):
        for s in range(world):
            packed = int(layout_range[i, s])
            begin, n = packed >> 32, packed & 0xFFFFFFFF
            for j in range(begin, begin + n):
                y[i, j] = _value(rank * num_local + i, s, int(src_info[i, j]), hidden=LL_HIDDEN)
    ref = torch.empty(tokens, LL_HIDDEN, dtype=BF16)
    for t in range(tokens):
        acc = torch.zeros(LL_HIDDEN, dtype=torch.float32)
        for k in range(3):
            e = int(idx[t, k])
            if e >= 0:
                prod = _value(e, rank, t, hidden=LL_HIDDEN).double() * float(w[t, k])
                acc = (acc.double() + prod).float()
        ref[t] = acc.to(BF16)
    out, event, hook = buffer.low_latency_combine(y, idx, w, handle)
    assert hook is None and torch.equal(out.view(torch.int16), ref.view(torch.int16))
    # FMA probe: slot 0 row 1.0 with weight 1+2^-7+2^-23, slot 1 row -(1+2^-7) with weight 1+2^-23: a fused
    # multiply-add keeps the -2^-30 a rounded product would lose
    w_probe = torch.tensor([[1 + 2**-7 + 2**-23, 1 + 2**-23, 0.5]] * tokens, dtype=torch.float32)
    y_probe = torch.zeros_like(y)
    for i in range(num_local):
        for s in range(world):
            packed = int(layout_range[i, s])
            begin, n = packed >> 32, packed & 0xFFFFFFFF
            for j in range(begin, begin + n):
                slot = idxs[s][int(src_info[i, j])].tolist().index(rank * num_local + i)
                y_probe[i, j] = (1.0, -(1 + 2**-7), 0.0)[slot]
    out_probe, _, _ = buffer.low_latency_combine(y_probe, idx, w_probe, handle)
    for t in range(tokens):
        want = -(2.0**-30) if idx[t, 1] >= 0 else float(torch.tensor(1 + 2**-7 + 2**-23).to(BF16))
        assert bool((out_probe[t].float() == want).all()), (t, out_probe[t, 0], want)
    target = torch.empty(tokens, LL_HIDDEN, dtype=BF16)
    buffer.low_latency_dispatch(x, idx, t_max, experts, use_fp8=False)  # any LL call toggles the buffer half
    out2, _, hook = buffer.low_latency_combine(y, idx, w, handle, out=target, return_recv_hook=True)
    assert out2 is target
    hook()
    assert torch.equal(target.view(torch.int16), ref.view(torch.int16))
    staging = buffer.get_next_low_latency_combine_buffer(handle)
    assert staging.shape == y.shape and staging.stride()[1] == LL_HIDDEN + 2 * LL_HIDDEN // 128
    staging.copy_(y)
    out3, _, _ = buffer.low_latency_combine(torch.zeros_like(y), idx, w, handle, zero_copy=True)
    assert torch.equal(out3.view(torch.int16), ref.view(torch.int16))

    # a corrupted handle: a wrong src_info entry (rank 1) leaves a token's slot unwritten on its owner
    bad_info = src_info.clone()
    if rank == 1:
        bad_info[0, 1] = t_max - 1  # no rank has that many tokens: the real row's slot stays unwritten
    outcome = "ok"
    try:
        buffer.low_latency_combine(y, idx, w, (bad_info, layout_range, t_max, LL_HIDDEN, experts))
    except deep_ep._standin.Panic as e:
        outcome = str(e)
    outcomes = gather(outcome)
    assert any(o != "ok" for o in outcomes), outcomes
    # host checks
    raises(
        lambda: buffer.low_latency_dispatch(x[:, :1536].contiguous(), idx, t_max, experts),
        words='(csrc/kernels/legacy/launch.cuh:132): false and "Unsupported hidden"',
    )
    raises(
        lambda: buffer.low_latency_dispatch(x, idx, t_max, experts, use_ue8m0=True),
        words="(csrc/legacy/buffer.hpp:1535): round_scale",
    )
    raises(
        lambda: buffer.low_latency_dispatch(x, idx, t_max, experts, async_finish=True, return_recv_hook=True),
        words="(csrc/legacy/buffer.hpp:1511): not(async and return_recv_hook)",
    )
    raises(
        lambda: buffer.low_latency_dispatch(x, idx.repeat(1, 4).contiguous(), t_max, experts),
        words="(csrc/kernels/legacy/internode_ll.cu:501): num_topk <= kNumMaxTopK",
    )
    raises(
        lambda: buffer.low_latency_combine(y, idx, w, handle, use_logfmt=True, zero_copy=True),
        words="(csrc/kernels/legacy/internode_ll.cu:1182): not(zero_copy and use_logfmt)",
    )
    buffer.clean_low_latency_buffer(t_max, LL_HIDDEN, experts)


def check_low_latency_unshuffled(deep_ep, rank, world):
    """``ll_shuffle_seed=None``: segments in source-rank order, rows in token order."""
    deep_ep._standin.configure(ll_shuffle_seed=None)
    try:
        experts, t_max = 2 * world, 4
        hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(t_max, LL_HIDDEN, world, experts)
        buffer = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=2)
        idx = torch.tensor([[e % experts for e in range(rank, rank + 3)]] * 3, dtype=torch.int64)
        x = torch.ones(3, LL_HIDDEN, dtype=BF16)
        _, count, handle, _, _ = buffer.low_latency_dispatch(x, idx, t_max, experts, use_fp8=False)
        idxs = gather(idx)
        for i in range(2):
            e = rank * 2 + i
            order = [(s, t) for s in range(world) for t in range(3) if e in idxs[s][t].tolist()]
            assert handle[0][i, : len(order)].tolist() == [t for _, t in order]
            begins = [int(v) >> 32 for v in handle[1][i]]
            assert begins == sorted(begins)
    finally:
        deep_ep._standin.configure()


def check_low_latency_shrink(deep_ep, rank, world):
    """Shrink mode: every rank masks the last one (whose tokens select nothing); the kernels skip it. A rank that
    is masked by a sender but not by the receiver times out and is masked automatically."""
    experts, num_local, t_max, masked = 2 * world, 2, 4, world - 1
    hint = deep_ep.Buffer.get_low_latency_rdma_size_hint(t_max, LL_HIDDEN, world, experts)
    buffer = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=2, enable_shrink=True)
    status = torch.ones(world, dtype=torch.int32)
    buffer.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0] * world
    buffer.low_latency_update_mask_buffer(masked, True)
    buffer.low_latency_query_mask_buffer(status)
    assert status.tolist() == [int(r == masked) for r in range(world)]
    idx = torch.tensor([[(rank + j + t) % experts for j in range(3)] for t in range(3)], dtype=torch.int64)
    if rank == masked:
        idx.fill_(-1)
    x = torch.full((3, LL_HIDDEN), rank + 1.0, dtype=BF16)
    w = torch.tensor([[0.5, 0.25, 2.0]] * 3)
    recv, count, handle, _, _ = buffer.low_latency_dispatch(x, idx, t_max, experts, use_fp8=False)
    idxs = gather(idx)
    for i in range(num_local):
        e = rank * num_local + i
        want = 0 if rank == masked else sum(int((idxs[s] == e).sum()) for s in range(world) if s != masked)
        assert int(count[i]) == want, (i, int(count[i]), want)
    out, _, _ = buffer.low_latency_combine(recv, idx, w, handle)
    for t in range(3 if rank != masked else 0):
        acc = 0.0
        for k in range(3):
            if idx[t, k] // num_local != masked:
                acc = struct.unpack("f", struct.pack("f", acc + (rank + 1.0) * float(w[t, k])))[0]
        assert bool((out[t].float() == torch.tensor(acc).to(BF16).float()).all())
    buffer.low_latency_clean_mask_buffer()
    buffer.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0] * world
    if rank == masked:  # only this sender masks rank 0: rank 0 times out waiting and masks it
        buffer.low_latency_update_mask_buffer(0, True)
    buffer.low_latency_dispatch(x, idx, t_max, experts, use_fp8=False)
    buffer.low_latency_query_mask_buffer(status)
    assert status.tolist() == (
        [int(r == masked) for r in range(world)]
        if rank == 0
        else [int(rank == masked and r == 0) for r in range(world)]
    )
    plain = deep_ep.Buffer(dist.group.WORLD, 0, hint, low_latency_mode=True, num_qps_per_rank=2)
    raises(lambda: plain.low_latency_update_mask_buffer(0, True), words="Shrink mode must be enabled")


CHECK_ORDER = (
    check_layout,
    check_dispatch_and_handle,
    check_worst_tokens,
    check_fp8,
    check_combine,
    check_mutations,
    check_host_asserts,
    check_undersized_buffers,
    check_low_latency,
    check_low_latency_unshuffled,
    check_low_latency_shrink,
)


def all_checks(rank: int, world_size: int) -> None:
    from tests.upstream.standin import installed

    with installed("deep_ep") as deep_ep:  # puts tests/standins on this process's sys.path
        for check in CHECK_ORDER:
            try:
                check(deep_ep, rank, world_size)
            except BaseException as e:
                raise AssertionError(f"{check.__name__} failed on rank {rank}/{world_size}: {e}") from e
            dist.barrier()
        assert deep_ep._standin.CALLS and deep_ep._standin.CALLS[0][0] == "Buffer.__init__"


CHECKS = {"all": all_checks}


def rank_checks(rank: int, world_size: int, store_path: str) -> None:
    run_named(CHECKS, rank, world_size, store_path, "all", timeout_s=60)
