"""DeepGEMM 2.8's ``bf16_mega_gate`` / ``get_bf16_mega_gate_config`` on our compat package (specs/upstream_2609.md
§2), checked as upstream's ``test_mega_gate.py`` checks the kernel, against an fp64 reference written from the spec
(router GEMM, score, biased ranking, unbiased weights ``u / (Σu + 1e-20) · scale``, shared slots, physical map
``to_physical_map[l, (ep_rank + t·23333) % logical_count[l]]``, masked rows):

* weights within ``calc_diff < 1e-11`` of the reference; the selected set equal to the exact top-K up to ties
  (``max unselected − min selected <= 1e-5 + 1e-5·max|key|``); shared-slot weights exactly 1; 10 repeats bitwise;
* ``unmapped_topk_idx`` written in place (-1 on masked rows), ``fix_routing_mask`` reading it, ``out=``;
* ``force_random`` rows: K distinct physical ids in range, positive weights, unmapped -1;
* SGLang's call (sqrtsoftplus, hash-routed layer with ``fix_routing_mask`` of ones) and upstream's refusals.
"""

from __future__ import annotations

import math

import pytest
import torch

import torch_ascend_moe.deep_gemm as deep_gemm
from torch_ascend_moe.testing import calc_diff

HASH = 23333


def _score(x: torch.Tensor, scoring: str) -> torch.Tensor:
    if scoring == "sigmoid":
        return torch.sigmoid(x)
    if scoring == "sqrtsoftplus":
        return torch.nn.functional.softplus(x).sqrt()
    return x


def _reference(x, weight, k, shared, scale, ep_rank, scoring, mask=None, bias=None, physical=None, count=None):
    """fp64 (idx, weights, unmapped, keys) from the spec's math; ranking on the FP32 logits' scores."""
    logits32 = x.float() @ weight.float().t()
    u = _score(logits32.double(), scoring)
    keys = u + (bias.double() if bias is not None else 0)
    T, E = u.shape
    idx = torch.full((T, k + shared), -1, dtype=torch.int64)
    w = torch.zeros(T, k + shared, dtype=torch.float64)
    unmapped = torch.full((T, k), -1, dtype=torch.int64)
    for t in range(T):
        if mask is not None and not mask[t]:
            continue
        order = sorted(range(E), key=lambda e: (-float(keys[t, e]), e))[:k]
        s = u[t, order]
        unmapped[t] = torch.tensor(order)
        w[t, :k] = s / (s.sum() + 1e-20) * scale
        logical = order + list(range(E, E + shared))
        w[t, k:] = 1.0
        if physical is not None:
            logical = [int(physical[lg, (ep_rank + t * HASH) % int(count[lg])]) for lg in logical]
        idx[t] = torch.tensor(logical)
    return idx, w, unmapped, keys


def _case(t, h, e, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).bfloat16()
    weight = (torch.randn(e, h, generator=g) * h**-0.5).bfloat16()
    return x, weight, g


def _ties_only(sel: torch.Tensor, keys: torch.Tensor, k: int) -> None:
    """The selected set differs from the exact top-k only by ties (upstream's check)."""
    for t in range(keys.shape[0]):
        chosen = sel[t, :k]
        if (chosen < 0).all():
            continue
        others = torch.ones(keys.shape[1], dtype=torch.bool)
        others[chosen] = False
        if others.any():
            gap = float(keys[t, others].max() - keys[t, chosen].min())
            assert gap <= 1e-5 + 1e-5 * float(keys[t].abs().max()), (t, gap)


@pytest.mark.parametrize(
    "e, shared, k, scoring",
    [(64, 2, 6, "sqrtsoftplus"), (128, 0, 6, "sigmoid"), (256, 2, 8, "identity"), (384, 1, 9, "sigmoid")],
)
def test_matches_the_reference(e, shared, k, scoring):
    x, weight, g = _case(37, 256, e, e + k)
    mask = torch.rand(37, generator=g) > 0.2
    bias = torch.randn(e, generator=g)
    dup = 2
    physical = torch.randperm((e + shared) * dup, generator=g).view(e + shared, dup).to(torch.int32)
    count = torch.randint(1, dup + 1, (e + shared,), generator=g, dtype=torch.int32)
    unmapped = torch.full((37, k), 7, dtype=torch.int64)
    args = (x, weight, k, shared > 0, shared, 1.5, 3, scoring)
    kw = dict(mask=mask, bias=bias, to_physical_map=physical, logical_count=count, unmapped_topk_idx=unmapped)
    idx, w = deep_gemm.bf16_mega_gate(*args, **kw)
    r_idx, r_w, r_unmapped, keys = _reference(x, weight, k, shared, 1.5, 3, scoring, mask, bias, physical, count)
    assert idx.dtype == torch.int64 and w.dtype == torch.float32 and idx.shape == (37, k + shared)
    assert calc_diff(w[:, :k], r_w[:, :k]) < 1e-11
    assert bool((w[mask, k:] == 1.0).all()) and bool((w[~mask] == 0).all()) and bool((idx[~mask] == -1).all())
    _ties_only(unmapped, keys, k)
    assert torch.equal(unmapped[~mask], torch.full_like(unmapped[~mask], -1))
    # Physical ids follow the map at the logical ids chosen (whatever ties picked).
    for t in torch.nonzero(mask).flatten().tolist():
        logical = unmapped[t].tolist() + list(range(e, e + shared))
        want = [int(physical[lg, (3 + t * HASH) % int(count[lg])]) for lg in logical]
        assert idx[t].tolist() == want
    for _ in range(10):  # repeated calls bitwise equal
        again = deep_gemm.bf16_mega_gate(*args, **dict(kw, unmapped_topk_idx=None))
        assert torch.equal(again[0], idx) and torch.equal(again[1], w)


def test_fix_routing_and_out_and_force_random():
    x, weight, g = _case(12, 512, 64, 4)
    k = 6
    hash_ids = torch.stack([torch.randperm(64, generator=g)[:k] for _ in range(12)])
    fixed = torch.ones(12, dtype=torch.bool)
    out = (torch.empty(12, k, dtype=torch.int64), torch.empty(12, k, dtype=torch.float32))
    # SGLang's hash-routed layer: fix_routing_mask of ones with the hash ids, sqrtsoftplus, no shared slots.
    unmapped = hash_ids.clone()
    idx, w = deep_gemm.bf16_mega_gate(
        x, weight, k, False, 0, 2.5, 0, "sqrtsoftplus", fix_routing_mask=fixed, unmapped_topk_idx=unmapped, out=out
    )
    assert idx is out[0] and w is out[1]
    assert torch.equal(idx, hash_ids) and torch.equal(unmapped, hash_ids)  # the order is kept
    u = torch.nn.functional.softplus(x.float() @ weight.float().t()).sqrt().double()
    s = u.gather(1, hash_ids)
    assert calc_diff(w, s / (s.sum(1, keepdim=True) + 1e-20) * 2.5) < 1e-11
    rows = torch.zeros(12, dtype=torch.bool)
    rows[[1, 5, 6]] = True
    unmapped = torch.zeros(12, k, dtype=torch.int64)
    idx, w = deep_gemm.bf16_mega_gate(
        x, weight, k, False, 0, 1.0, 0, "sigmoid", unmapped_topk_idx=unmapped, force_random=rows
    )
    for t in (1, 5, 6):
        assert len(set(idx[t].tolist())) == k and 0 <= int(idx[t].min()) and int(idx[t].max()) < 64
        assert bool((w[t] > 0).all()) and bool((unmapped[t] == -1).all())
    assert bool((unmapped[~rows] >= 0).all())


def test_empty_and_nan_inputs():
    x, weight, _ = _case(0, 256, 32, 1)
    idx, w = deep_gemm.bf16_mega_gate(x, weight, 4, False, 0, 1.0, 0, "sigmoid")
    assert idx.shape == (0, 4) and w.shape == (0, 4)
    x, weight, _ = _case(4, 256, 32, 2)
    x[2, 7] = float("nan")
    mask = torch.tensor([True, True, False, True])  # masked rows are scored too, as upstream's kernel asserts
    with pytest.raises(ValueError, match=r"bf16_mega_gate: argument 'x' values: expected finite gate scores .* row 2"):
        deep_gemm.bf16_mega_gate(x, weight, 4, False, 0, 1.0, 0, "sigmoid", mask=mask)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(h=128), r"argument 'x' size\(1\) \(H\): expected a multiple of 256, got 128"),
        (dict(e=30), r"argument 'weight' size\(0\) \(E\): expected a multiple of 4 in \(0, 512\], got 30"),
        (dict(k=33), r"argument 'num_topk' value: expected in \(0, min\(E, 32\)=32\], got 33"),
        (dict(shared=3), r"argument 'num_shared_experts' value: expected 1 or 2 \(use_shared_as_routed\), got 3"),
        (dict(shared=2, k=5), r"argument 'num_topk' value: expected a multiple of num_shared_experts=2, got 5"),
        (dict(scoring="softmax"), r"argument 'scoring_func' value: expected 'sigmoid', 'sqrtsoftplus' or 'identity'"),
        (dict(scale=math.inf), r"argument 'routed_scaling_factor' value: expected finite, got inf"),
        (dict(dtype=torch.float32), r"argument 'x' dtype: expected torch.bfloat16, got torch.float32"),
    ],
)
def test_refuses_what_upstream_refuses(change, match):
    x, weight, _ = _case(4, change.get("h", 256), change.get("e", 64), 3)
    x = x.to(change.get("dtype", torch.bfloat16))
    shared = change.get("shared", 0)
    with pytest.raises(ValueError, match="deep_gemm.bf16_mega_gate: " + match):
        deep_gemm.bf16_mega_gate(
            x,
            weight,
            change.get("k", 6),
            shared > 0,
            shared,
            change.get("scale", 1.0),
            0,
            change.get("scoring", "sigmoid"),
        )


def test_config_reports_the_sm_count():
    config = deep_gemm.get_bf16_mega_gate_config(4096, 7168, 384, 6)
    assert set(config) == {
        "block_tokens",
        "num_mma_ctas",
        "num_split_k",
        "num_expert_groups",
        "num_gate_warpgroups",
        "num_sms",
    }
    assert config["num_sms"] == deep_gemm.get_num_sms() and config["num_split_k"] == 1


def test_force_random_slots_are_distinct_from_the_shared_ones():
    """Upstream's routing-controls check: a forced-random token's K + S physical experts are all distinct."""
    x, weight, g = _case(40, 256, 64, 8)
    k, shared, dup = 6, 1, 2
    physical = torch.arange((64 + shared) * dup, dtype=torch.int32).view(64 + shared, dup)
    count = torch.full((64 + shared,), dup, dtype=torch.int32)
    rows = torch.ones(40, dtype=torch.bool)
    for _ in range(5):
        idx, w = deep_gemm.bf16_mega_gate(
            x, weight, k, True, shared, 1.0, 0, "sigmoid", to_physical_map=physical, logical_count=count,
            force_random=rows,
        )  # fmt: skip
        for t in range(40):
            assert len(set(idx[t].tolist())) == k + shared, idx[t]
        assert bool((w[:, :k] > 0).all()) and bool((w[:, k:] == 1).all())
