"""moe_topk_gate and the routing helpers against references written from the spec, on TileKernels' own test grid
(through the compat ``tile_kernels.moe``), its stability check, and the analytic backward against autograd of the
weights' formula."""

import pytest
import torch

import torch_ascend_moe.tile_kernels as tile_kernels
from tests.moe_gate.specs import gate_call, reference
from torch_ascend_moe import moe_topk_gate
from torch_ascend_moe.ops import moe_gate as helpers
from torch_ascend_moe.routing_math import gate_scores

# TileKernels' test configurations: (groups, topk groups, routed experts, shared experts, topk).
_CONFIGS = [
    (0, 0, 72, 1, 6),
    (0, 0, 32, 2, 6),
    (0, 0, 36, 2, 6),
    (0, 0, 144, 2, 6),
    (8, 8, 256, 2, 8),
    (8, 4, 256, 2, 8),
]
_EXTRA = 32


def _inputs(T, E, groups, topk_groups, topk, scoring, g):
    """Random logits and bias with clear gaps at every decision (TileKernels' test does the same: near ties are not
    reproducible across kernels that round differently)."""
    while True:
        logits, bias = torch.randn(T, E, generator=g), torch.randn(E, generator=g)
        u = gate_scores(logits, scoring)
        ranking = (logits if scoring == "softmax" else u) + bias
        if groups != topk_groups:
            group = (
                ranking.view(T, groups, E // groups).topk(2, dim=-1).values.sum(-1).sort(dim=-1, descending=True).values
            )
            if not (group[:, topk_groups - 1] - group[:, topk_groups] > 1e-6).all():
                continue
            kept = torch.zeros(T, groups, dtype=torch.bool).scatter_(1, helpers.topk_gate(group, topk_groups), True)
            ranking = ranking.view(T, groups, -1).masked_fill(~kept[:, :, None], float("-inf")).view(T, E)
        top = ranking.topk(topk + 1, dim=-1).values
        if (top[:, :-1] - top[:, 1:] > 2e-6).all():
            return logits, bias


@pytest.mark.parametrize("config", _CONFIGS, ids=str)
@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus", "softmax"])
def test_upstream_grid(config, scoring):
    groups, topk_groups, E, S, k = config
    g = torch.Generator().manual_seed(E * 10 + k)
    shared_ok = k % S == 0 and E % (k // S) == 0
    for padded in (0, 10):
        for tp_rank in (0, 1):
            for shared in (False, True) if shared_ok else (False,):
                for fix in (False, True):
                    T = 48
                    logits, bias = _inputs(T, E, groups, topk_groups, k, scoring, g)
                    logits = torch.cat([logits, torch.randn(padded, E, generator=g)])
                    mask = None
                    if padded:
                        mask = torch.ones(T + padded, dtype=torch.bool)
                        mask[-padded:] = False
                    physical = count = None
                    if shared:  # upstream's map: every logical expert to itself in every column
                        physical = torch.arange(E + S, dtype=torch.int32)[:, None].expand(-1, _EXTRA + 1).contiguous()
                        count = torch.ones(E + S, dtype=torch.int32)
                    unmapped = torch.zeros(T + padded, k, dtype=torch.int64)
                    fix_mask = None
                    if fix:
                        fix_mask = torch.ones(T + padded, dtype=torch.bool)
                        unmapped = torch.randint(0, E, (T + padded, k), generator=torch.Generator().manual_seed(42))
                    given = unmapped.clone()
                    args = (logits, bias, k, topk_groups, groups, shared, S, 1.5, 0, 4, tp_rank, 2, scoring)
                    idx, weights = tile_kernels.moe.top2_sum_gate(
                        *args, mask=mask, fix_routing_mask=fix_mask, to_physical_map=physical, logical_count=count,
                        unmapped_topk_idx=unmapped,
                    )  # fmt: skip
                    ref_w, ref_idx, ref_unmapped, _ = reference(
                        logits, bias, k, groups, topk_groups, scoring, 1.5, S if shared else 0, mask, fix_mask, given,
                        physical, count, 0, 4, tp_rank, 2, None, None, True,
                    )  # fmt: skip
                    assert torch.equal(idx.sort(1).values, ref_idx.sort(1).values)
                    assert torch.equal(unmapped.sort(1).values, ref_unmapped.sort(1).values)
                    torch.testing.assert_close(
                        weights.sort(1).values.double(), ref_w.sort(1).values, rtol=1e-6, atol=1e-7
                    )


@pytest.mark.parametrize("config", _CONFIGS, ids=str)
def test_ties_resolve_to_the_lower_expert(config):
    """Upstream's stability check: all-zero logits route each token to the first experts of this rank."""
    groups, topk_groups, E, S, k = config
    T = 20
    zeros = torch.zeros(T, E)
    idx, _ = tile_kernels.moe.top2_sum_gate(
        zeros, torch.zeros(E), k, topk_groups, groups, False, S, 1.5, 0, 4, 0, 2, "sigmoid"
    )
    first = min(E // 4, k)
    assert (idx[:, :first] == torch.arange(first)).all()


def test_the_ascend_era_gate():
    """moe_topk_gate_forward's rules: sqrt-softplus, the denominator plus 1e-20, image bias on image tokens."""
    g = torch.Generator().manual_seed(3)
    logits, bias = torch.randn(30, 64, generator=g), torch.randn(64, generator=g) * 0.1
    args = gate_call(logits, bias, 6, 0, 0, "sqrtsoftplus", 0, g, image=True, clamp=False)
    ours = torch.ops.ascend_moe.moe_topk_gate(*args)
    ref = reference(*args)
    assert torch.equal(ours[1], ref[1])
    torch.testing.assert_close(ours[0].double(), ref[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("scoring", ["sigmoid", "sqrtsoftplus", "softmax"])
@pytest.mark.parametrize("clamp", [True, False])
def test_backward_is_the_weights_formula(scoring, clamp):
    """The analytic backward equals autograd through ``w = u[idx] / D · s`` (with the op's own selection), the
    scores output's gradient included (an aux-loss term), masked rows and a fixed -1 slot too."""
    g = torch.Generator().manual_seed(5)
    T, E, k = 9, 24, 4
    logits = torch.randn(T, E, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([True] * 7 + [False] * 2)
    fix = torch.zeros(T, dtype=torch.bool)
    fix[2] = True
    unmapped = torch.randint(0, E, (T, k), generator=g)
    unmapped[2, 1] = -1
    options = dict(scoring_func=scoring, routed_scaling_factor=1.5, mask=mask, fix_routing_mask=fix)
    w, idx, routed, u = moe_topk_gate(logits, None, k, unmapped_topk_idx=unmapped, clamp_denominator=clamp, **options)
    gw, gu = torch.randn(T, k, generator=g, dtype=torch.float64), torch.randn(T, E, generator=g, dtype=torch.float64)
    (w * gw).sum().add((u * gu).sum()).backward()
    x = logits.detach().clone().requires_grad_()
    scores = gate_scores(x, scoring)
    s = scores.gather(1, routed.clamp(min=0))
    total = s.sum(-1, keepdim=True)
    weights = s / (total.clamp(min=1e-20) if clamp else total + 1e-20) * 1.5
    active = mask[:, None]
    (torch.where(active, weights, 0) * gw).sum().add((torch.where(active, scores, 0) * gu).sum()).backward()
    torch.testing.assert_close(logits.grad, x.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("bad", [16, 99, -2])
def test_tile_kernels_counts_name_an_id_out_of_range(bad):
    """Upstream's aux_fi / group_count kernels device-assert ``-1 <= id < n``: ours name the function and the
    argument (not a scatter's index error), and -1 entries stay ignored."""
    idx = torch.tensor([[0, 3, -1], [2, bad, 1]])
    for api, call, arg in (
        ("aux_fi", lambda: tile_kernels.moe.aux_fi(idx, 16, 3), "topk_idx"),
        ("group_count", lambda: tile_kernels.moe.group_count(idx, 16), "group_idx"),
    ):
        with pytest.raises(ValueError, match=rf"tile_kernels\.moe\.{api}: argument '{arg}' values: expected ids in"):
            call()
    kept = idx.clamp(-1, 15)
    assert tile_kernels.moe.group_count(kept, 16).tolist() == [int((kept == e).sum()) for e in range(16)]


def test_helpers_against_the_spec():
    g = torch.Generator().manual_seed(1)
    w = torch.rand(50, 7, generator=g)
    denominator, normalized = helpers.normalize_weight(w)
    expected = torch.full((50,), 1e-20)
    for j in range(7):  # summed in slot order, starting from 1e-20: bitwise
        expected = expected + w[:, j]
    assert torch.equal(denominator, expected) and torch.equal(normalized, w / expected[:, None])

    idx = torch.randint(-1, 16, (40, 6), generator=g)
    counts = [int((idx == e).sum()) for e in range(16)]
    assert helpers.group_count(idx, 16).tolist() == counts
    assert torch.equal(helpers.aux_fi(idx, 16, 6), torch.tensor(counts).float() * 16 / (40 * 6))
    assert torch.equal(helpers.aux_fi(idx[:0], 16, 6), torch.zeros(16))

    per, tp = 8, 2
    indices = torch.randint(-1, 4 * per * tp, (30, 5), generator=g)
    for rank in range(tp):
        masked = helpers.mask_indices_by_tp(indices, 4 * per * tp, 4 * tp, rank, tp)
        for i, v in zip(indices.flatten().tolist(), masked.flatten().tolist()):
            d, rest = divmod(i, per * tp)
            r, j = divmod(rest, per)
            assert v == (d * per + j if i >= 0 and r == rank else -1)

    groups = torch.randint(-1, 5, (30, 6), generator=g)
    unique = groups.clone()
    tile_kernels.moe.inplace_unique_group_indices(unique, 5)
    for row, out in zip(groups.tolist(), unique.tolist()):
        seen = set()
        assert out == [-1 if v in seen or seen.add(v) else v for v in row]

    scores = torch.randint(0, 4, (20, 12), generator=g).float()  # many ties
    picked = helpers.topk_gate(scores, 5)
    for row, got in zip(scores.tolist(), picked.tolist()):
        assert got == sorted(range(12), key=lambda e: (-row[e], e))[:5]
    grouped = torch.randn(20, 4, 6, generator=g)
    best = helpers.topk_sum_and_topk_group_idx(grouped, 2, 2)
    sums = grouped.topk(2, dim=-1).values.sum(-1)
    for row, got in zip(sums.tolist(), best.tolist()):
        assert got == sorted(range(4), key=lambda i: (-row[i], i))[:2]


def test_compat_keeps_upstreams_asserts():
    logits, bias = torch.randn(4, 16), torch.randn(16)
    call = tile_kernels.moe.top2_sum_gate
    with pytest.raises(AssertionError, match="IDENTITY"):
        call(logits, bias, 4, 0, 0, False, 0, 1.0, 0, 1, 0, 1, "identity")
    with pytest.raises(AssertionError, match="both zero or both non-zero"):
        call(logits, bias, 4, 2, 0, False, 0, 1.0, 0, 1, 0, 1, "sigmoid")
    with pytest.raises(AssertionError):
        call(logits.double(), bias, 4, 0, 0, False, 0, 1.0, 0, 1, 0, 1, "sigmoid")
    with pytest.raises(ValueError, match="not a valid ScoringFunc"):
        call(logits, bias, 4, 0, 0, False, 0, 1.0, 0, 1, 0, 1, "tanh")
    assert tile_kernels.torch.stable_topk is helpers.topk_gate
    tile_kernels.set_num_sms(1)
    assert tile_kernels.get_num_sms() == 1
