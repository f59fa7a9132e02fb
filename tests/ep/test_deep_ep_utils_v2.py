"""DeepEP V2's test utilities ``deep_ep.utils.refs`` / ``gate`` / ``semantic`` (specs/deepep_api.md §8.4) on CPU:
hand-computed references in this process, ``refs.dispatch`` on 2 spawned gloo ranks
(tests.distributed.deep_ep_refs_bodies)."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.distributed.deep_ep_refs_bodies import CHECKS, run_check
from torch_ascend_moe.deep_ep.utils import gate, refs, semantic
from torch_ascend_moe.deep_ep.utils.math import ceil_div

BF16 = torch.bfloat16


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_refs_on_two_gloo_ranks(name, tmp_path):
    mp.spawn(run_check, args=(2, str(tmp_path / "store"), name), nprocs=2, join=True)


@pytest.fixture
def one_rank_group(tmp_path):
    """A 1-rank gloo group for the helpers that read the world size; torn down after the test."""
    if dist.is_initialized():  # another test's one-rank group (tests.ep.specs keeps one per process) serves
        if dist.get_world_size() != 1:
            pytest.skip("a multi-rank process group is initialized in this process")
        yield
        return
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store1"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- ordered_accumulate


def _hand_accumulate(data: torch.Tensor, initial: torch.Tensor | None) -> torch.Tensor:
    """Element by element, FP32 scalars, slot order (no float64 anywhere)."""
    n, k, h = data.shape
    out = torch.empty(n, h, dtype=data.dtype)
    for t in range(n):
        for c in range(h):
            acc = torch.tensor(0.0, dtype=torch.float32) if initial is None else initial[t, c].clone()
            for j in range(k):
                acc = acc + data[t, j, c].float()
            out[t, c] = acc.to(data.dtype)
    return out


def test_ordered_accumulate_is_fp32_in_slot_order():
    g = torch.Generator().manual_seed(1)
    data = (torch.randn(5, 4, 6, generator=g) * torch.logspace(-3, 3, 6)).to(BF16)
    initial = torch.randn(5, 6, generator=g)
    for init in (None, initial):
        got = refs.ordered_accumulate(data, init)
        assert got.dtype == BF16 and got.shape == (5, 6)
        assert torch.equal(got, _hand_accumulate(data, init))

    # FP32 and slot order matter: 2^24 + 1 rounds back to 2^24 in FP32, so [2^24, 1, -2^24] sums to 0 in order
    # although the exact (or any other-order) sum is 1.
    big = torch.tensor([[[2.0**24], [1.0], [-(2.0**24)]]], dtype=BF16)
    assert refs.ordered_accumulate(big).item() == 0.0
    assert refs.ordered_accumulate(big[:, [0, 2, 1]]).item() == 1.0


# ---------------------------------------------------------------------------------------------- combine


def _hand_combine(y, topk_idx, num_scaleout, num_scaleup, num_experts, bias, reduce_in_local, reduce_in_scaleup):
    """The combine of §8.4 written out per token with Python dicts instead of a sort."""
    per_rank = num_experts // (num_scaleout * num_scaleup)
    n, k, h = y.shape
    y = y.clone()
    levels = []
    if reduce_in_local:
        levels.append(per_rank)
    if reduce_in_scaleup:
        levels.append(per_rank * num_scaleup)
    for divisor in levels:
        for t in range(n):
            groups: dict[int, list[int]] = {}
            for j in range(k):
                groups.setdefault(int(topk_idx[t, j]) // divisor, []).append(j)
            for slots in groups.values():
                acc = torch.zeros(h, dtype=torch.float32)
                for j in slots:
                    acc = acc + y[t, j].float()
                for j in slots:
                    y[t, j] = 0
                y[t, slots[-1]] = acc.to(y.dtype)
    if isinstance(bias, tuple):
        bias = bias[0].float() + bias[1].float()
    elif bias is not None:
        bias = bias.float()
    out = torch.empty(n, h, dtype=y.dtype)
    for t in range(n):
        acc = torch.zeros(h, dtype=torch.float32) if bias is None else bias[t].clone()
        for j in range(k):
            acc = acc + y[t, j].float()
        out[t] = acc.to(y.dtype)
    return out


def test_combine_rounds_each_rank_group_at_its_last_slot():
    # 2 ranks, 1 expert each. Token 0: slots (rank 0, rank 1, rank 0) = (1, 2^-8, 2^-8).
    # Grouped: rank 0's 1 + 2^-8 is a BF16 tie that rounds to 1, then 2^-8 + 1 -> 1 again: 1.0.
    # Ungrouped: one FP32 sum 1 + 2^-7, exact in BF16: 1.0078125.
    y = torch.tensor([[[1.0], [2.0**-8], [2.0**-8]]], dtype=BF16)
    idx = torch.tensor([[0, 1, 0]])
    grouped = refs.combine(y, idx, 1, 2, 2, None, True, False)
    flat = refs.combine(y, idx, 1, 2, 2, None, False, False)
    assert grouped.item() == 1.0
    assert flat.item() == 1.0 + 2.0**-7
    # The group's sum sits at its LAST slot. 3 ranks, slots (rank 0: 1, rank 1: 2^24, rank 2: -2^24, rank 0: 0):
    # the final FP32 pass sees (0, 2^24, -2^24, 1) -> 1; at the first slot it would see (1, 2^24, -2^24, 0), where
    # 2^24 + 1 rounds to 2^24, -> 0.
    y3 = torch.tensor([[[1.0], [2.0**24], [-(2.0**24)], [0.0]]], dtype=BF16)
    assert refs.combine(y3, torch.tensor([[0, 1, 2, 0]]), 1, 3, 3, None, True, False).item() == 1.0
    assert refs.combine(y3, torch.tensor([[0, 1, 2, 0]]), 1, 3, 3, None, False, False).item() == 0.0
    # The two biases are summed in FP32, not BF16: 1 + 2^-8 (kept) + 2^-8 from y = 1 + 2^-7, where a BF16 bias sum
    # would have rounded 1 + 2^-8 to 1 first and given 1.0.
    y2 = torch.tensor([[[0.0], [2.0**-8], [0.0]]], dtype=BF16)
    bias = (torch.ones(1, 1, dtype=BF16), torch.full((1, 1), 2.0**-8, dtype=BF16))
    assert refs.combine(y2, idx, 1, 2, 2, bias, True, False).item() == 1.0 + 2.0**-7
    assert y.tolist() == [[[1.0], [2.0**-8], [2.0**-8]]], "combine must not modify y"


@pytest.mark.parametrize(
    "num_scaleout,num_scaleup,local,scaleup",
    [(1, 4, False, False), (1, 4, True, False), (2, 2, True, False), (2, 2, True, True), (1, 4, True, True)],
)
@pytest.mark.parametrize("num_bias", [0, 1, 2])
def test_combine_matches_hand_computation(num_scaleout, num_scaleup, local, scaleup, num_bias):
    g = torch.Generator().manual_seed(7)
    n, k, h, experts = 6, 5, 8, 8
    # Many magnitudes, so that the grouping shows in the roundings.
    y = (torch.randn(n, k, h, generator=g) * torch.logspace(-4, 2, h)).to(BF16)
    idx = torch.randint(0, experts, (n, k), generator=g)
    idx[0, 1] = -1  # a masked slot groups with the other -1s (floor division), zero data in practice
    y[0, 1] = 0
    biases = [torch.randn(n, h, generator=g).to(BF16) for _ in range(num_bias)]
    bias = None if num_bias == 0 else biases[0] if num_bias == 1 else tuple(biases)
    got = refs.combine(y, idx, num_scaleout, num_scaleup, experts, bias, local, scaleup)
    want = _hand_combine(y, idx, num_scaleout, num_scaleup, experts, bias, local, scaleup)
    assert got.dtype == BF16 and torch.equal(got, want)


def test_combine_rejects_scaleup_without_local():
    y = torch.zeros(1, 2, 4, dtype=BF16)
    with pytest.raises(ValueError, match="reduce_in_scaleup"):
        refs.combine(y, torch.zeros(1, 2, dtype=torch.long), 1, 2, 2, None, False, True)


# ---------------------------------------------------------------------------------------------- pre-combine data


def test_generate_pre_combine_data(one_rank_group):
    ids = torch.tensor([0, 1, 5, 7], dtype=torch.int32)
    y = refs.generate_pre_combine_data(ids, 8, 3, 64)
    assert y.dtype == BF16 and y.shape == (4, 3, 64)
    assert torch.equal(y, refs.generate_pre_combine_data(ids, 8, 3, 64)), "not deterministic"
    assert (y != 0).all(), "zero-valued expert output"
    # The documented formula, world size 1 and global seed 0 (sin(0) = 0).
    seeds = ids.long().unsqueeze(1) * 3 + torch.arange(3)
    phase = ((seeds * 131071 % 24).float() + 1) / 24
    want = torch.sin(phase.unsqueeze(-1) * torch.arange(1, 65, dtype=torch.float32)).to(BF16)
    assert torch.equal(y, want)
    # A token's values depend on its global id only: a subset regenerates the same rows.
    assert torch.equal(refs.generate_pre_combine_data(ids[2:], 8, 3, 64), y[2:])
    # Distinct (token, slot) pairs get distinct data.
    rows = y.reshape(12, 64)
    assert len({tuple(r.tolist()) for r in rows}) == 12


# ---------------------------------------------------------------------------------------------- gate


def _rank_token_counts(scores: torch.Tensor, num_ranks: int, num_topk: int) -> torch.Tensor:
    num_tokens, num_experts = scores.shape
    topk = torch.topk(scores, num_topk, dim=-1, largest=True, sorted=False)[1] // (num_experts // num_ranks)
    hit = torch.zeros(num_tokens, num_ranks)
    hit[torch.arange(num_tokens).unsqueeze(1).expand_as(topk), topk] = 1
    return hit.sum(dim=0)


@pytest.mark.parametrize("precise", [True, False])
def test_unbalanced_scores_shape_dtype_device(precise):
    torch.manual_seed(0)
    scores = gate.get_unbalanced_scores(64, 32, 4, 4, 2.0, precise)
    assert scores.shape == (64, 32) and scores.dtype == torch.float32
    assert scores.device == torch.get_default_device()
    assert ((0 <= scores) & (scores < 100)).all()


@pytest.mark.parametrize("precise", [True, False])
def test_unbalanced_ratio(precise):
    torch.manual_seed(0)
    for ratio in (1.0, 2.0):
        counts = _rank_token_counts(gate.get_unbalanced_scores(4096, 64, 8, 6, ratio, precise), 8, 6)
        got = counts[0].item() / counts[1:].mean().item()
        assert abs(got - ratio) < 0.25 * ratio, (ratio, counts.tolist())


def test_precise_rank_count_rows():
    torch.manual_seed(3)
    rank_count = gate.generate_rank_count(512, 32, 8, 6, 2.0)
    assert rank_count.dtype == torch.int32 and rank_count.shape == (512, 8)
    assert (rank_count.sum(dim=1) == 6).all()
    topk_idx = gate.generate_topk_idx(rank_count, 512, 32, 8, 6)
    assert topk_idx.shape == (512, 6)
    # Each token's experts are distinct and split over ranks exactly as rank_count says.
    assert (topk_idx.sort(dim=1)[0].diff(dim=1) > 0).all()
    per_rank = torch.zeros(512, 8, dtype=torch.int32).scatter_add_(
        1, topk_idx // 4, torch.ones_like(topk_idx, dtype=torch.int32)
    )
    assert torch.equal(per_rank, rank_count)
    with pytest.raises(ValueError, match="sum to"):
        gate.generate_topk_idx(rank_count + 1, 512, 32, 8, 6)
    with pytest.raises(ValueError, match="ratio"):
        gate.generate_rank_count(8, 32, 8, 6, 0.5)


@pytest.fixture
def one_thread():
    """Thousands of small ops: intra-op threads only add spinning, a lot of it on a loaded machine."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def test_upstream_test_gate_on_cpu(one_thread):
    """Upstream's tests/utils/test_gate.py on CPU, on a smaller grid (ranks 2..16, experts per rank 1..8): in precise
    mode rank 0 gets ``ratio`` times the tokens of the others within 10 % and the others are within 2 % of each other;
    random mode has to run through."""
    torch.manual_seed(0)
    for num_tokens in (1, 4096):
        for num_experts_per_rank in (1, 4, 8):
            for num_ranks in (2, 4, 8, 16):
                num_experts = num_experts_per_rank * num_ranks
                for num_topk in (1, 2, 4, 6, 8, 9):
                    if num_topk > num_experts:
                        continue
                    for ratio in (1.0, 2.0, 4.0):
                        lower = max(1, ceil_div(num_topk, num_experts_per_rank))
                        upper = min(min(num_topk, num_ranks), int((num_ranks - 1) / ratio) + 1)
                        if lower > upper:
                            continue
                        for precise in (True, False):
                            if not precise and num_tokens > 1:
                                # Random mode is never checked upstream; one token keeps its bisection cheap.
                                continue
                            total = torch.zeros(num_ranks)
                            for _ in range(num_ranks):
                                scores = gate.get_unbalanced_scores(
                                    num_tokens, num_experts, num_ranks, num_topk, ratio, precise
                                )
                                total += _rank_token_counts(scores, num_ranks, num_topk)
                            if num_tokens > 1000 and precise:
                                lo = max(total[1:].min().item(), 1)
                                practical_ratio, inequality = total[0].item() / lo, total[1:].max().item() / lo
                                assert abs(practical_ratio - ratio) / ratio < 0.1 and inequality < 1.02, (
                                    num_experts,
                                    num_ranks,
                                    num_topk,
                                    ratio,
                                    practical_ratio,
                                    inequality,
                                )


# ---------------------------------------------------------------------------------------------- semantic


def test_value_or():
    assert semantic.value_or(None, 3) == 3
    assert semantic.value_or(0, 3) == 0
    assert semantic.value_or(False, True) is False


def test_weak_lru_caches_and_does_not_keep_self_alive():
    calls = []

    class Thing:
        def __init__(self, base):
            self.base = base

        @semantic.weak_lru(maxsize=8)
        def plus(self, x):
            calls.append(x)
            return self.base + x

    a, b = Thing(10), Thing(20)
    assert a.plus(1) == 11 and a.plus(1) == 11 and a.plus(2) == 12
    assert calls == [1, 2], "second call with the same argument was not cached"
    assert b.plus(1) == 21 and calls == [1, 2, 1], "cache must be per instance"
    assert Thing.plus.__name__ == "plus"

    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is None, "weak_lru kept self alive"


def test_megatron_import_form(monkeypatch):
    """Megatron-LM's ``from deep_ep.utils import EventHandle, EventOverlap`` (DeepEP V1's module) finds both names, the
    package's own classes (its DeepEP dispatcher takes DeepEP for missing when the import fails)."""
    import sys

    import torch_ascend_moe.deep_ep as ours

    monkeypatch.setitem(sys.modules, "deep_ep", ours)
    monkeypatch.setitem(sys.modules, "deep_ep.utils", ours.utils)
    from deep_ep.utils import EventHandle, EventOverlap

    assert EventHandle is ours.EventHandle and EventOverlap is ours.EventOverlap
