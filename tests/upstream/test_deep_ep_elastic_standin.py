"""Self-tests of the CPU stand-in's DeepEP V2 API (``deep_ep.ElasticBuffer`` / ``EPHandle``,
``tests/standins/deep_ep/_elastic*.py``).

In-process: the pieces that need no process group (buffer-size arithmetic written here from ``csrc/elastic/
buffer.hpp`` and ``layout.cuh``, ``EPHandle``'s constructor order, the Ascend refusals that come before any
collective). On 2 and 4 spawned gloo ranks (one spawn per world size runs every check): a small version of upstream's
``tests/elastic/test_ep.py`` against a port of upstream's ``deep_ep/utils/refs.py``
(``tests/upstream/deep_ep_elastic_refs.py``): sorted-by-global-id equality of rows / SF / top-k ids / weights, counts,
cached == uncached bitwise, deterministic order, combine bitwise equal to ``refs.combine`` with 0/1/2 biases,
expanded layout, no CPU sync, host asserts, mutated handles, the Ascend flavour.
"""

from __future__ import annotations

import functools

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.capture_emulation import capturing_everywhere
from tests.distributed import run_named
from tests.upstream import deep_ep_elastic_refs as refs
from tests.upstream.standin import installed

BF16, FP8 = torch.bfloat16, torch.float8_e4m3fn
MIB2 = 2 * 1024 * 1024
HIDDEN, NUM_TOPK, NUM_MAX = 64, 3, 12
HANDLE_FIELDS = (
    "do_expand",
    "num_experts",
    "expert_alignment",
    "num_max_tokens_per_rank",
    "num_sms",
    "topk_idx",
    "num_recv_tokens",
    "num_expanded_tokens",
    "num_recv_tokens_per_expert_list",
    "psum_num_recv_tokens_per_scaleup_rank",
    "psum_num_recv_tokens_per_expert",
    "num_unaligned_recv_tokens_per_expert",
    "recv_src_metadata",
    "dst_buffer_slot_idx",
    "token_metadata_at_forward",
    "channel_linked_list",
)


@pytest.fixture
def deep_ep():
    with installed("deep_ep") as module:
        yield module


# ---------------------------------------------------------------------------------------------------------------------
# In-process
# ---------------------------------------------------------------------------------------------------------------------


def _align(a, b):
    return -(-a // b) * b


def _token_bytes(hidden_bytes, sf_bytes, topk, with_meta):
    meta = topk * 8 + ((1 + topk) * 4 if with_meta else 0)
    return _align(hidden_bytes, 32) + _align(sf_bytes, 32) + _align(meta, 32)


def _direct_size_hint(ranks, num_max, hidden, topk, fp8, multiple_reduction):
    """calculate_buffer_size (buffer.hpp:652-686) for one NVLink domain (no send areas)."""
    topk = topk or 32
    sf = -(-hidden // 32) * 4 if fp8 else 0
    dispatch = ranks * num_max * _token_bytes(hidden * (1 if fp8 else 2), sf, topk, True)
    combine = (min(ranks, topk) if multiple_reduction else topk) * num_max * _token_bytes(hidden * 2, 0, topk, False)
    return _align(max(dispatch, combine), MIB2)


class _Group:
    def __init__(self, size, rank=0):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


@pytest.mark.parametrize("ranks", [2, 4, 8, 16])
def test_size_hint_and_domains(deep_ep, ranks):
    group = _Group(ranks)
    hint = deep_ep.ElasticBuffer.get_buffer_size_hint
    for args in ((4096, 7168, 6, False), (4096, 7168, 0, True), (128, 2048, 8, True), (33, 256, 2, False)):
        for mr in (True, False):
            assert hint(group, *args, allow_multiple_reduction=mr) == _direct_size_hint(ranks, *args, mr)
    assert deep_ep.get_physical_domain_size(group) == (1, ranks)
    assert deep_ep.get_logical_domain_size(group) == deep_ep.get_logical_domain_size(group, False) == (1, ranks)
    with pytest.raises(
        RuntimeError, match=r"csrc/elastic/buffer\.hpp:657\): num_max_tokens_per_rank > 0 and hidden > 0"
    ):
        hint(group, 0, 7168)
    # hidden * 2 bytes must be a multiple of 32 (the TMA-aligned token layout)
    with pytest.raises(RuntimeError, match=r"layout\.cuh:198\): num_hidden_bytes % ptx::kNumTMAAlignBytes == 0"):
        hint(group, 16, 72)


def test_two_nodes_and_hybrid_sizes(deep_ep):
    deep_ep._standin.configure(num_nvlink_ranks=8)
    group = _Group(16)
    assert deep_ep.get_physical_domain_size(group) == (2, 8)
    assert deep_ep.get_logical_domain_size(group) == (2, 8)
    assert deep_ep.get_logical_domain_size(group, allow_hybrid_mode=False) == (1, 16)
    # direct over RDMA: a send area of one rank for dispatch, R ranks for combine
    token = _token_bytes(7168 * 2, 0, 6, True)
    direct = deep_ep.ElasticBuffer.get_buffer_size_hint(group, 64, 7168, 6, allow_hybrid_mode=False)
    combine = _token_bytes(7168 * 2, 0, 6, False) * (16 * 64 + 6 * 64)
    assert direct == _align(max(token * 17 * 64, combine), MIB2)
    hybrid = deep_ep.ElasticBuffer.get_buffer_size_hint(group, 64, 7168, 6)
    ctoken = _token_bytes(7168 * 2, 0, 6, False)
    combine = ctoken * (6 * 2 * 64 + 2 * 64 + 2 * (64 + 1280))
    assert hybrid == _align(max(token * (8 * 2 * 64 + 64 + 2 * (64 + 1280)), combine), MIB2)
    with pytest.raises(RuntimeError, match=r"nccl\.cu:52\): num_ranks % num_nvl_ranks == 0"):
        deep_ep.get_physical_domain_size(_Group(12))


def test_exports_handle_and_group_none(deep_ep):
    assert deep_ep.__version__ == "2.1.0"
    t = torch.zeros(2, 3, dtype=torch.int64)
    handle = deep_ep.EPHandle(*range(5), t, *range(6, 16))
    assert [getattr(handle, n) for n in HANDLE_FIELDS] == [*range(5), t, *range(6, 16)]
    assert handle.cached_recv_src_metadata_before_sort is None
    with pytest.raises(AssertionError):
        deep_ep.EPHandle(False, 8, 1, 4, 4, None, 0, 0, [], None, None, None, None, None, None, None)
    with pytest.raises(AttributeError, match="rank"):
        deep_ep.ElasticBuffer(None)
    assert isinstance(deep_ep.ElasticBuffer.capture(), deep_ep.EventHandle)
    deep_ep._standin.configure(platform="ascend", num_nvlink_ranks=2)
    assert isinstance(deep_ep.ElasticBuffer.capture(), deep_ep.EventHandle)  # an event, not a graph capture
    with pytest.raises(deep_ep._standin.AscendUnsupported, match="CPU buffer"):
        deep_ep.ElasticBuffer(_Group(2), num_bytes=2 * MIB2, num_cpu_bytes=MIB2)
    with pytest.raises(deep_ep._standin.AscendUnsupported, match="hybrid routing"):
        deep_ep.ElasticBuffer(_Group(4), num_bytes=2 * MIB2)
    with pytest.raises(ValueError, match="platform"):
        deep_ep._standin.configure(platform="npu")


# ---------------------------------------------------------------------------------------------------------------------
# Spawned ranks
# ---------------------------------------------------------------------------------------------------------------------


def gather(obj):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def any_rank(flag: bool) -> bool:
    t = torch.tensor([1 if flag else 0])
    dist.all_reduce(t)
    return int(t) > 0


def raises(fn, exc=RuntimeError, words=()):
    try:
        fn()
    except exc as e:
        for w in [words] if isinstance(words, str) else words:
            assert w in str(e), f"{w!r} not in {str(e)!r}"
        return e
    raise AssertionError(f"{fn} did not raise {exc.__name__}")


def routing(rank, num_tokens, num_experts, seed):
    """Distinct experts per token, ~25% of slots -1 (weights 0 there, as upstream's masked test), token 0 nowhere."""
    g = torch.Generator().manual_seed(seed * 1000 + rank)
    idx = torch.argsort(torch.rand(num_tokens, num_experts, generator=g), dim=1)[:, :NUM_TOPK].contiguous()
    idx = idx.masked_fill(torch.rand(num_tokens, NUM_TOPK, generator=g) < 0.25, -1)
    idx[0] = -1
    w = (torch.rand(num_tokens, NUM_TOPK, generator=g) + 0.5).masked_fill(idx < 0, 0.0)
    x = torch.randn(num_tokens, HIDDEN, generator=g).to(BF16)
    return x, idx, w


def fp8_input(x, int_packs: bool):
    """An FP8 ``(x, sf)`` pair: per-32-channel scales, float32 or packed as int32 (bit patterns only matter)."""
    xs = x.float().view(x.size(0), -1, 32)
    amax = xs.abs().amax(-1).clamp(min=1e-4)
    data = (xs * (448.0 / amax).unsqueeze(-1)).to(FP8).view(x.size(0), -1)
    sf = (amax / 448.0).contiguous()
    return data, (sf.view(torch.int32) if int_packs else sf)


def rows_of(t):
    return t.view(torch.uint8).reshape(t.size(0), -1) if t.dtype.itemsize == 1 else t


def check_against_ref(recv, ref, num_recv, L, alignment):
    """upstream test_ep.py:445-500 (unexpanded)."""
    recv_x, recv_idx, recv_w, handle = recv
    ref_x, ref_idx, ref_w, ref_src, ref_counts = ref
    meta = handle.recv_src_metadata[:num_recv]
    order = torch.sort(meta[:, 0]).indices
    assert torch.equal(meta[order, 0], ref_src)
    pairs = [(recv_idx, ref_idx, False)]
    if isinstance(recv_x, tuple):
        pairs += [(rows_of(recv_x[0]), rows_of(ref_x[0]), False), (recv_x[1], ref_x[1], False)]
    else:
        pairs.append((recv_x, ref_x, False))
    if ref_w is not None:
        pairs.append((recv_w, ref_w, True))
    else:
        assert recv_w is None
    if ref_w is not None:  # copied unmasked: the raw weight of every slot, local or not
        assert torch.equal(recv_w[:num_recv][order], ref_w)
    for got, want, mask in pairs:
        got = got[:num_recv][order]
        if mask:
            got, want = got.masked_fill(ref_idx < 0, 0), want.masked_fill(ref_idx < 0, 0)
        assert torch.equal(got, want), (got, want)
    psum = [0] + handle.psum_num_recv_tokens_per_expert.tolist()
    for i in range(L):
        ref_count = int((ref_idx == i).sum())
        assert psum[i + 1] - psum[i] == _align(ref_count, alignment)
        assert int(handle.num_unaligned_recv_tokens_per_expert[i]) == ref_count
    assert handle.psum_num_recv_tokens_per_scaleup_rank.tolist() == ref_counts.cumsum(0).tolist()


def check_slots_and_metadata(handle, num_recv, rank, world, topk_all, idx, L):
    """``recv_src_metadata[:, 1]`` = src rank * K + the highest local lane; ``dst_buffer_slot_idx`` >= 0 exactly at
    the highest lane of each destination rank, ``rank * num_max + slot`` with the slots of one destination a
    permutation of ``range(count)``."""
    meta = handle.recv_src_metadata[:num_recv]
    for g, m1 in zip(meta[:, 0].tolist(), meta[:, 1].tolist(), strict=True):
        s, t = divmod(g, NUM_MAX)
        lanes = [k for k, e in enumerate(topk_all[s][t].tolist()) if rank * L <= e < (rank + 1) * L]
        assert m1 == s * NUM_TOPK + max(lanes)
    slots = handle.dst_buffer_slot_idx
    assert slots.dtype == torch.int32 and tuple(slots.shape) == tuple(idx.shape)
    for r in range(world):
        owner = torch.where(idx >= 0, idx // L, -1)
        want = torch.zeros_like(slots, dtype=torch.bool)
        for t in range(idx.size(0)):
            lanes = [k for k in range(NUM_TOPK) if int(owner[t, k]) == r]
            if lanes:
                want[t, max(lanes)] = True
        got = slots[want]
        assert sorted((got - rank * NUM_MAX).tolist()) == list(range(int(want.sum())))
    assert bool((slots[slots >= 0] >= rank * NUM_MAX).all()) and int((slots >= 0).sum()) == sum(
        len({int(e) // L for e in row if e >= 0}) for row in idx
    )


def combine_input(handle, recv_idx, num_recv, n_alloc):
    """upstream test_ep.py:185-195: per received token, ``ordered_accumulate`` of its local slots' pre-combine data."""
    gidx = handle.recv_src_metadata[:num_recv, 0]
    y = refs.generate_pre_combine_data(gidx, NUM_MAX, NUM_TOPK, HIDDEN)
    y[recv_idx[:num_recv] == -1] = 0
    out = torch.zeros(n_alloc, HIDDEN, dtype=BF16)
    out[:num_recv] = refs.ordered_accumulate(y)
    return out


def ref_combined(rank, num_tokens, idx, world, E, bias, recipe):
    y = refs.generate_pre_combine_data(rank * NUM_MAX + torch.arange(num_tokens), NUM_MAX, NUM_TOPK, HIDDEN)
    y[idx == -1] = 0
    return refs.combine(y, idx, 1, world, E, bias, *recipe)


def make_bias(num_bias, num_tokens, seed):
    g = torch.Generator().manual_seed(seed)
    biases = tuple(torch.randn(num_tokens, HIDDEN, generator=g).to(BF16) for _ in range(num_bias))
    return None if num_bias == 0 else biases[0] if num_bias == 1 else biases


def check_dispatch_combine(deep_ep, rank, world):
    """The mode matrix of test_ep.py, trimmed: (fp8, alignment, bias count, events, handle copy, deterministic)."""
    L = 3
    E = L * world
    num_tokens = NUM_MAX - rank
    x, idx, w = routing(rank, num_tokens, E, seed=1)
    topk_all = gather(idx)
    group = dist.group.WORLD
    buffers = {
        det: deep_ep.ElasticBuffer(
            group, num_max_tokens_per_rank=NUM_MAX, hidden=HIDDEN, num_topk=NUM_TOPK, deterministic=det
        )
        for det in (False, True)
    }
    b0 = buffers[False]
    assert (b0.num_ranks, b0.rank_idx, b0.num_max_tokens_per_rank, b0.num_allocated_qps) == (world, rank, NUM_MAX, 129)
    assert (b0.num_scaleout_ranks, b0.num_scaleup_ranks, b0.scaleout_rank_idx, b0.scaleup_rank_idx) == (
        1,
        world,
        0,
        rank,
    )
    assert b0.num_bytes == _direct_size_hint(world, NUM_MAX, HIDDEN, NUM_TOPK, False, True) == 2 * 1024 * 1024
    assert b0.get_comm_stream() is None and buffers[True].deterministic
    # elastic.py:728-834 by hand: expected top-k ranks 1.9 / 2.4727, NVLink traffic 1/2 / 3/4 of 191.2464 GB/s,
    # write-bound at 50 GB/s per SM: 7.65 / 5.10 SMs, x1.25, ceil, even
    num_sms = b0.get_theoretical_num_sms(E, NUM_TOPK)
    assert num_sms == {2: 10, 4: 8}[world] and b0.get_theoretical_num_qps(num_sms) == min(num_sms * 16 + 1, 129)
    cases = [
        # fp8 (None | "f32" | "i32"), alignment, bias, deterministic, events, handle copy, weights
        (None, 1, 0, False, False, True, True),
        ("f32", 4, 1, False, True, False, True),
        (None, 1, 2, True, False, True, True),
        ("i32", 2, 0, True, True, True, False),
    ]
    for fp8, alignment, num_bias, det, events, copy, with_w in cases:
        buffer = buffers[det]
        xin = fp8_input(x, fp8 == "i32") if fp8 else x
        weights = w if with_w else None
        ref = refs.dispatch(xin, idx, weights, NUM_MAX, E)
        num_recv = int(ref[4].sum())
        kw = {"num_experts": E, "expert_alignment": alignment, "num_sms": 8, "do_handle_copy": copy}
        if fp8 == "i32":
            kw["use_tma_aligned_col_major_sf"] = True
        if events:
            kw.update(previous_event=buffer.capture(), allocate_on_comm_stream=True, async_with_compute_stream=True)
        recv_x, recv_idx, recv_w, handle, event = buffer.dispatch(xin, idx, weights, **kw)
        if events:
            event.current_stream_wait()  # runs the deterministic epilogue when async
        assert (idx.data_ptr() != handle.topk_idx.data_ptr()) == copy and torch.equal(handle.topk_idx, idx)
        assert handle.num_recv_tokens == num_recv and handle.recv_src_metadata.shape == (num_recv, NUM_TOPK + 2)
        assert handle.num_sms == 8 and handle.num_experts == E and handle.expert_alignment == alignment
        assert handle.recv_src_metadata.dtype == handle.psum_num_recv_tokens_per_expert.dtype == torch.int32
        check_against_ref((recv_x, recv_idx, recv_w, handle), ref, num_recv, L, alignment)
        assert handle.num_recv_tokens_per_expert_list == [_align(int((ref[1] == i).sum()), alignment) for i in range(L)]
        check_slots_and_metadata(handle, num_recv, rank, world, topk_all, idx, L)
        assert bool((handle.recv_src_metadata[:, 2:] == 0x7F7F7F7F).all())  # never written without expand
        if fp8 == "i32":  # TMA-aligned column-major SF
            assert recv_x[1].stride() == (1, _align(num_recv, 4)) and recv_x[1].dtype == torch.int32
        gidx = handle.recv_src_metadata[:, 0]
        if det:  # (src rank, src token) order, twice the same
            assert torch.equal(gidx, torch.sort(gidx).values)
            again = buffer.dispatch(xin, idx, weights, **{k: v for k, v in kw.items() if k != "previous_event"})
            if events:
                again[4].current_stream_wait()
            assert torch.equal(rows_of(again[0][0] if fp8 else again[0]), rows_of(recv_x[0] if fp8 else recv_x))
            assert torch.equal(again[3].recv_src_metadata[:, :1], handle.recv_src_metadata[:, :1])
        # cached dispatch: bitwise equal, same handle object
        ckw = {"num_sms": 8, "handle": handle}
        if events:
            ckw.update(previous_event=buffer.capture(), allocate_on_comm_stream=True, async_with_compute_stream=True)
        c_x, c_idx, c_w, c_handle, c_event = buffer.dispatch(xin, topk_weights=weights, **ckw)
        if events:
            c_event.current_stream_wait()
        assert c_handle is handle and torch.equal(c_idx, recv_idx)
        if fp8:
            assert torch.equal(rows_of(c_x[0]), rows_of(recv_x[0])) and torch.equal(c_x[1], recv_x[1])
        else:
            assert torch.equal(c_x, recv_x)
        if with_w:
            assert torch.equal(c_w, recv_w)
        # combine: bitwise refs.combine (reduce in rank, then in slot order from the biases), weights back exactly
        bias = make_bias(num_bias, num_tokens, seed=rank + 7)
        xc = combine_input(handle, recv_idx, num_recv, num_recv)
        combined, combined_w, _ = buffer.combine(xc, handle, topk_weights=recv_w, bias=bias)
        assert torch.equal(combined, ref_combined(rank, num_tokens, idx, world, E, bias, (True, False)))
        if with_w:
            assert torch.equal(combined_w, w)
        else:
            assert combined_w is None
    # cumulative stats: incremented by the unaligned counts
    stats = torch.full((L,), 5, dtype=torch.int32)
    _, recv_idx, _, handle, _ = b0.dispatch(x, idx, w, stats, num_experts=E, expert_alignment=4, num_sms=8)
    assert stats.tolist() == [5 + int((recv_idx == i).sum()) for i in range(L)]
    return buffers


def check_arrival_order(deep_ep, rank, world, buffers):
    """Non-deterministic buffer: grouped by source rank, shuffled inside a group (sorted after sorting); unshuffled
    with ``elastic_shuffle_seed=None``."""
    E = 3 * world
    x, idx, w = routing(rank, NUM_MAX - rank, E, seed=2)
    shuffled = False
    for _ in range(2):
        _, _, _, handle, _ = buffers[False].dispatch(x, idx, w, num_experts=E, num_sms=8)
        gidx = handle.recv_src_metadata[:, 0]
        src = torch.div(gidx, NUM_MAX, rounding_mode="floor")
        assert torch.equal(src, torch.sort(src).values)
        shuffled |= not torch.equal(gidx, torch.sort(gidx).values)
    assert any_rank(shuffled)
    deep_ep._standin.configure(elastic_shuffle_seed=None)
    _, _, _, handle, _ = buffers[False].dispatch(x, idx, w, num_experts=E, num_sms=8)
    gidx = handle.recv_src_metadata[:, 0]
    assert torch.equal(gidx, torch.sort(gidx).values)
    deep_ep._standin.configure()


def check_no_cpu_sync(deep_ep, rank, world, buffers):
    """Worst-case allocation, the real count on "device" only, garbage past it; combine reads the count there."""
    L, E = 3, 3 * world
    num_tokens = NUM_MAX - rank
    x, idx, w = routing(rank, num_tokens, E, seed=3)
    n_alloc = world * NUM_MAX
    for det in (False, True):
        recv_x, recv_idx, recv_w, handle, _ = buffers[det].dispatch(
            x, idx, w, num_experts=E, num_sms=8, do_cpu_sync=False, expert_alignment=2
        )
        ref = refs.dispatch(x, idx, w, NUM_MAX, E)
        num_recv = int(handle.psum_num_recv_tokens_per_scaleup_rank[-1])
        assert num_recv == int(ref[4].sum()) and handle.num_recv_tokens == n_alloc
        assert recv_x.shape == (n_alloc, HIDDEN) and recv_idx.shape == recv_w.shape == (n_alloc, NUM_TOPK)
        assert (
            handle.recv_src_metadata.shape == (n_alloc, NUM_TOPK + 2) and handle.num_recv_tokens_per_expert_list == []
        )
        assert handle.num_expanded_tokens == _align(world * NUM_MAX * min(NUM_TOPK, L) + L, 2)
        assert bool(recv_x[num_recv:].isnan().all()) and bool(recv_w[num_recv:].isnan().all())
        assert bool((recv_idx[num_recv:] == 0x7F7F7F7F7F7F7F7F).all())
        check_against_ref((recv_x, recv_idx, recv_w, handle), ref, num_recv, L, 2)
        if det:
            gidx = handle.recv_src_metadata[:num_recv, 0]
            assert torch.equal(gidx, torch.sort(gidx).values)
        xc = combine_input(handle, recv_idx, num_recv, n_alloc)
        combined, combined_w, _ = buffers[det].combine(xc, handle, topk_weights=recv_w)
        assert torch.equal(combined, ref_combined(rank, num_tokens, idx, world, E, None, (True, False)))
        assert torch.equal(combined_w, w)
        c_x, _, _, c_handle, _ = buffers[det].dispatch(x, handle=handle, num_sms=8)
        assert c_handle is handle and torch.equal(c_x[:num_recv], recv_x[:num_recv]) and c_x.shape[0] == n_alloc


def check_expand(deep_ep, rank, world, buffers):
    """Expanded layout (test_ep.py:156-177, 411-432, 505-511), with and without multiple reduction."""
    L, E = 3, 3 * world
    num_tokens = NUM_MAX - rank
    x, idx, w = routing(rank, num_tokens, E, seed=4)
    alignment = 4
    no_mr = deep_ep.ElasticBuffer(
        dist.group.WORLD, num_max_tokens_per_rank=NUM_MAX, hidden=HIDDEN, allow_multiple_reduction=False
    )
    ref = refs.dispatch(x, idx, w, NUM_MAX, E)
    num_recv = int(ref[4].sum())
    for buffer, mr in ((buffers[False], True), (buffers[True], True), (no_mr, False)):
        kw = {"num_experts": E, "expert_alignment": alignment, "num_sms": 8}
        compact = buffer.dispatch(x, idx, w, **kw)
        e_x, e_idx, e_w, e_handle, _ = buffer.dispatch(x, idx, w, do_expand=True, **kw)
        assert e_idx is None and e_w.dim() == 1 and e_handle.do_expand
        assert e_handle.recv_src_metadata.shape == (num_recv, NUM_TOPK + 2)
        psum = [0] + e_handle.psum_num_recv_tokens_per_expert.tolist()
        for i in range(L):
            assert psum[i + 1] - _align(psum[i], alignment) == int((ref[1] == i).sum())
        assert e_x.shape[0] == e_handle.num_expanded_tokens == sum(e_handle.num_recv_tokens_per_expert_list)
        # fold: every (token, local slot) row equals the compact row of that token
        order_e = torch.sort(e_handle.recv_src_metadata[:, 0]).indices
        order_c = torch.sort(compact[3].recv_src_metadata[:, 0]).indices
        slots = e_handle.recv_src_metadata[order_e, 2:]
        c_idx = compact[1][order_c]
        assert torch.equal(slots >= 0, c_idx >= 0)
        for r, k in (slots >= 0).nonzero().tolist():
            assert (
                torch.equal(e_x[slots[r, k]], compact[0][order_c][r]) and e_w[slots[r, k]] == compact[2][order_c][r, k]
            )
        # cached expand with zero padding (and topk_weights carried again)
        c_x, _, c_w, _, _ = buffer.dispatch(
            x, topk_weights=w, num_sms=8, handle=e_handle, do_expand=True, do_zero_padding=True
        )
        valid = e_handle.recv_src_metadata[:, 2:][e_handle.recv_src_metadata[:, 2:] >= 0].long()
        assert torch.equal(c_x[valid], e_x[valid]) and torch.equal(c_w[valid], e_w[valid])
        for i in range(L):
            start = psum[i + 1]
            assert bool((c_x[start : _align(start, alignment)] == 0).all()) and bool(
                (c_w[start : _align(start, alignment)] == 0).all()
            )
        # expanded combine: one row per (token, expert) = that slot's pre-combine data
        gidx = e_handle.recv_src_metadata[:, 0]
        y = refs.generate_pre_combine_data(gidx, NUM_MAX, NUM_TOPK, HIDDEN)
        xe = torch.zeros(e_x.shape[0] + 1, HIDDEN, dtype=BF16)
        xe[e_handle.recv_src_metadata[:, 2:].flatten().long()] = y.view(-1, HIDDEN)
        xe = xe[:-1].contiguous()
        bias = make_bias(1 + rank % 2, num_tokens, seed=11)
        combined, combined_w, _ = buffer.combine(xe, e_handle, topk_weights=e_w if mr else None, bias=bias)
        recipe = (True, False) if mr else (False, False)
        assert torch.equal(combined, ref_combined(rank, num_tokens, idx, world, E, bias, recipe))
        assert torch.equal(combined_w, w) if mr else combined_w is None
        if not mr:  # the non-expanded combine does not depend on allow_multiple_reduction
            xc = combine_input(compact[3], compact[1], num_recv, num_recv)
            combined, _, _ = buffer.combine(xc, compact[3])
            assert torch.equal(combined, ref_combined(rank, num_tokens, idx, world, E, None, (True, False)))
            with_weights = functools.partial(buffer.combine, xe, e_handle, topk_weights=e_w)
            raises(with_weights, deep_ep._standin.Panic, "combine.cuh:69")


def check_combine_order(deep_ep, rank, world, buffers):
    """The reduction order is observable: fp32 absorbs small rows into ``2**30`` (ulp 128) unless the ``-2**30`` of
    rank 1 came first, so only "bias, then each rank's row at its highest lane, in lane order" passes."""
    L, E = 3, 3 * world
    num_tokens = NUM_MAX - rank
    _, idx, _ = routing(rank, num_tokens, E, seed=9)
    x = torch.zeros(num_tokens, HIDDEN, dtype=BF16)
    value = [1.0, -(2.0**30), 4.0, 16.0][:world]
    for buffer in buffers.values():
        _, _, _, handle, _ = buffer.dispatch(x, idx, num_experts=E, num_sms=8)
        xc = torch.full((handle.num_recv_tokens, HIDDEN), value[rank], dtype=BF16)
        bias = torch.full((num_tokens, HIDDEN), 2.0**30, dtype=BF16)
        combined, _, _ = buffer.combine(xc, handle, bias=bias)
        owner = torch.where(idx >= 0, idx // L, -1)
        y = torch.zeros(num_tokens, NUM_TOPK, HIDDEN, dtype=BF16)
        for t in range(num_tokens):
            for r in set(owner[t].tolist()) - {-1}:
                y[t, max(k for k in range(NUM_TOPK) if owner[t, k] == r)] = value[r]
        assert torch.equal(combined, refs.combine(y, idx, 1, world, E, bias, True, False))
        order_matters = refs.combine(y.flip(1), idx.flip(1), 1, world, E, bias, True, False)
        assert any_rank(not torch.equal(order_matters, combined))


def check_handles(deep_ep, rank, world, buffers):
    """A handle rebuilt from its saved fields works; mutated handles show (wrong result or Panic)."""
    Panic = deep_ep._standin.Panic
    E = 3 * world
    num_tokens = NUM_MAX - rank
    x, idx, w = routing(rank, num_tokens, E, seed=5)
    buffer = buffers[False]
    recv_x, recv_idx, recv_w, handle, _ = buffer.dispatch(x, idx, w, num_experts=E, num_sms=8)
    num_recv = handle.num_recv_tokens
    rebuilt = deep_ep.EPHandle(*[getattr(handle, n) for n in HANDLE_FIELDS])
    c_x, c_idx, _, c_handle, _ = buffer.dispatch(x, handle=rebuilt, num_sms=8)
    assert c_handle is rebuilt and torch.equal(c_x, recv_x) and torch.equal(c_idx, recv_idx)
    xc = combine_input(handle, recv_idx, num_recv, num_recv)
    want = ref_combined(rank, num_tokens, idx, world, E, None, (True, False))
    assert torch.equal(buffer.combine(xc, rebuilt)[0], want)

    def outcome(fn):
        try:
            return fn()
        except Panic:
            return None

    # two received rows' metadata swapped on rank 0: the rows go back to the wrong tokens
    mutated = deep_ep.EPHandle(*[getattr(handle, n) for n in HANDLE_FIELDS])
    mutated.recv_src_metadata = handle.recv_src_metadata.clone()
    if rank == 0 and num_recv >= 2:
        mutated.recv_src_metadata[[0, num_recv - 1]] = handle.recv_src_metadata[[num_recv - 1, 0]]
    out = outcome(lambda: buffer.combine(xc, mutated)[0])
    assert any_rank(out is None or not torch.equal(out, want))
    # a cached dispatch whose slots were mutated on rank 0: two tokens into one slot / a slot nobody writes
    mutated = deep_ep.EPHandle(*[getattr(handle, n) for n in HANDLE_FIELDS])
    mutated.dst_buffer_slot_idx = handle.dst_buffer_slot_idx.clone()
    if rank == 0:
        live = (mutated.dst_buffer_slot_idx >= 0).nonzero()
        (t0, k0), (t1, k1) = live[0].tolist(), live[-1].tolist()
        mutated.dst_buffer_slot_idx[t1, k1] = mutated.dst_buffer_slot_idx[t0, k0]
    out = outcome(lambda: buffer.dispatch(x, handle=mutated, num_sms=8)[0])
    assert any_rank(out is None or not torch.equal(out, recv_x))
    # a psum pointing past the rows: the copy epilogue's device assert
    mutated = deep_ep.EPHandle(*[getattr(handle, n) for n in HANDLE_FIELDS])
    mutated.psum_num_recv_tokens_per_scaleup_rank = handle.psum_num_recv_tokens_per_scaleup_rank - 1
    raises(lambda: buffer.dispatch(x, handle=mutated, num_sms=8), Panic, "dispatch_copy_epilogue.cuh:74")


def check_host_asserts(deep_ep, rank, world, buffers):
    """Host checks raise before any collective, with upstream's file:line and words."""
    E = 3 * world
    x, idx, w = routing(rank, NUM_MAX - rank, E, seed=6)
    buffer = buffers[False]
    kw = {"num_experts": E, "num_sms": 8}
    hpp = "csrc/elastic/buffer.hpp"
    raises(lambda: buffer.dispatch(x[0], idx, **kw), words="utils.hpp:17): t.dim() == kNumDims")
    big = torch.zeros(NUM_MAX + 1, HIDDEN, dtype=BF16)
    raises(lambda: buffer.dispatch(big, torch.full((NUM_MAX + 1, NUM_TOPK), -1), **kw), words=f"{hpp}:756)")
    raises(lambda: buffer.dispatch(x, idx.int(), **kw), words=f"{hpp}:777): topk_idx.scalar_type()")
    raises(lambda: buffer.dispatch(x, idx, **kw, num_qps=10**6), AssertionError, "Allocated QPs are not enough")
    raises(
        lambda: buffer.dispatch(x, idx, **kw, previous_event=buffer.capture()),
        words=f"{hpp}:540): allocate_on_comm_stream",
    )
    raises(lambda: buffer.dispatch(x, idx, **kw, do_zero_padding=True), words=f"{hpp}:731)")
    raises(lambda: buffer.dispatch(x, idx, num_experts=E + 1, num_sms=8), words=f"{hpp}:805)")
    raises(lambda: buffer.dispatch(x, idx, num_experts=E, num_sms=1000), words=f"{hpp}:979)")
    _, recv_idx, recv_w, handle, _ = buffer.dispatch(x, idx, w, **kw)
    raises(lambda: buffer.dispatch(x, idx, handle=handle, num_sms=8), AssertionError)
    raises(lambda: buffer.dispatch(x, handle=handle, do_cpu_sync=True, num_sms=8), AssertionError, "Cannot do CPU sync")
    raises(lambda: buffer.dispatch(x, handle=handle, num_experts=E * 2, num_sms=8), AssertionError)
    xc = torch.zeros(handle.num_recv_tokens, HIDDEN, dtype=BF16)
    raises(lambda: buffer.combine(xc.float(), handle), words=f"{hpp}:1203): x.scalar_type() == torch::kBFloat16")
    raises(lambda: buffer.combine(xc, handle, bias=torch.zeros(1, HIDDEN, dtype=BF16)), words=f"{hpp}:1244)")
    raises(lambda: buffer.combine(xc, handle, bias=(xc,)), AssertionError)
    raises(lambda: buffer.combine(xc, handle, topk_weights=recv_w.double()), words=f"{hpp}:1234)")
    # a buffer too small for the call's hidden size
    small = deep_ep.ElasticBuffer(dist.group.WORLD, num_bytes=2 * 1024 * 1024, explicitly_destroy=True)
    wide = torch.zeros(2, 8192, dtype=BF16)
    raises(
        lambda: small.dispatch(wide, torch.full((2, 8), -1), num_experts=E, num_max_tokens_per_rank=64, num_sms=8),
        words=f"{hpp}:963)",
    )
    raises(lambda: deep_ep.ElasticBuffer(dist.group.WORLD, num_bytes=12345), words=f"{hpp}:98)")
    raises(lambda: deep_ep.ElasticBuffer(dist.group.WORLD), words=f"{hpp}:657)")
    small.destroy()
    raises(lambda: buffers[True].destroy(), AssertionError)
    # under a graph capture the dispatch kernel does not run: the CPU wait for the counts times out
    with capturing_everywhere():
        raises(lambda: buffer.dispatch(x, idx, **kw), words=["Dispatch CPU wait exception", f"{hpp}:1063)"])
        c_x, _, _, _, _ = buffer.dispatch(x, handle=handle, num_sms=8)  # cached: no CPU wait
        n_x, _, _, n_handle, _ = buffer.dispatch(x, idx, **kw, do_cpu_sync=False)
    num_recv = handle.num_recv_tokens
    assert int(n_handle.psum_num_recv_tokens_per_scaleup_rank[-1]) == num_recv and c_x.shape[0] == num_recv


def check_ascend(deep_ep, rank, world, buffers):
    """``platform="ascend"``: the port's unsupported features are refused before any collective."""
    Unsupported = deep_ep._standin.AscendUnsupported
    E = 3 * world
    x, idx, w = routing(rank, NUM_MAX - rank, E, seed=8)
    deep_ep._standin.configure(platform="ascend")
    try:
        buffer = deep_ep.ElasticBuffer(
            dist.group.WORLD, num_max_tokens_per_rank=NUM_MAX, hidden=HIDDEN, explicitly_destroy=True
        )
        raises(lambda: buffer.dispatch(x, idx, w, num_experts=E), Unsupported, "automatic SM tuning")
        raises(lambda: buffer.dispatch(x, idx, w, num_experts=E, num_sms=73), Unsupported, "num_sms=73")
        raises(lambda: buffer.dispatch(x, idx, w, num_experts=E, num_sms=8, num_qps=2), Unsupported, "num_qps=2")
        raises(
            lambda: buffer.dispatch(x, idx, w, num_experts=E, num_sms=8, do_cpu_sync=False),
            Unsupported,
            "do_cpu_sync=False",
        )
        ev = buffer.capture()
        raises(
            lambda: buffer.dispatch(x, idx, w, num_experts=E, num_sms=8, previous_event_before_epilogue=ev), Unsupported
        )
        with capturing_everywhere():
            raises(lambda: buffer.dispatch(x, idx, w, num_experts=E, num_sms=8), Unsupported, "graph capture")
        recv_x, recv_idx, recv_w, handle, _ = buffer.dispatch(x, idx, w, num_experts=E, num_sms=8)
        c_x, _, _, _, _ = buffer.dispatch(x, handle=handle, num_sms=8)  # cached: no CPU sync, supported
        assert torch.equal(c_x, recv_x)
        xc = combine_input(handle, recv_idx, handle.num_recv_tokens, handle.num_recv_tokens)
        combined, _, _ = buffer.combine(xc, handle)
        assert torch.equal(combined, ref_combined(rank, NUM_MAX - rank, idx, world, E, None, (True, False)))
        raises(lambda: buffer.combine(xc, handle, num_qps=1), Unsupported)
        buffer.destroy()
    finally:
        deep_ep._standin.configure()


def all_checks(rank: int, world_size: int) -> None:
    with installed("deep_ep") as deep_ep:
        buffers = check_dispatch_combine(deep_ep, rank, world_size)
        for check in (
            check_arrival_order,
            check_combine_order,
            check_no_cpu_sync,
            check_expand,
            check_handles,
            check_host_asserts,
            check_ascend,
        ):
            try:
                check(deep_ep, rank, world_size, buffers)
            except BaseException as e:
                raise AssertionError(f"{check.__name__} failed on rank {rank}/{world_size}: {e}") from e
            dist.barrier()
        names = [name for name, _ in deep_ep._standin.CALLS]
        assert names[0] == "ElasticBuffer.__init__" and "ElasticBuffer.combine" in names


def rank_checks(rank: int, world_size: int, store_path: str) -> None:
    run_named({"all": all_checks}, rank, world_size, store_path, "all", timeout_s=60)


@pytest.mark.parametrize("world_size", [2, 4])
def test_on_ranks(world_size, tmp_path):
    mp.spawn(rank_checks, args=(world_size, str(tmp_path / "store")), nprocs=world_size, join=True)
