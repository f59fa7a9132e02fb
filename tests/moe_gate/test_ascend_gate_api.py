"""TileKernels' Ascend-era gate API through the compat package: ``moe_topk_gate_forward`` (and ``moe_topk_gate``)
against the spec's token-by-token reference (sqrt-softplus, ``+1e-20``, shared slots through a physical map, masks,
fixed routing, image bias), its out-parameters, ``force_random``; ``moe_topk_gate_backward`` against autograd of the
weights' and the aux term's formulas in FP64."""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.tile_kernels as tile_kernels
from tests.moe_gate.specs import EXTRA_EXPERTS, reference

moe = tile_kernels.moe


def _case(seed: int, tokens: int = 29, experts: int = 32, shared: int = 2):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g)
    bias = torch.randn(experts, generator=g) * 0.1
    image_bias = torch.randn(experts, generator=g) * 0.1
    image_mask = torch.rand(tokens, generator=g) > 0.5
    mask = torch.rand(tokens, generator=g) > 0.2
    fix = torch.rand(tokens, generator=g) > 0.6
    unmapped = torch.randint(0, experts, (tokens, 6), generator=g)
    physical = torch.randint(0, experts + EXTRA_EXPERTS, (experts + shared, EXTRA_EXPERTS + 1), generator=g,
                             dtype=torch.int32)  # fmt: skip
    count = torch.randint(1, 4, (experts + shared,), generator=g, dtype=torch.int32)
    return logits, bias, image_bias, image_mask, mask, fix, unmapped, physical, count


@pytest.mark.parametrize("ep_rank", [0, 5])
def test_forward_matches_the_spec(ep_rank):
    logits, bias, image_bias, image_mask, mask, fix, unmapped, physical, count = _case(ep_rank)
    buffer = unmapped.clone()
    scores = torch.empty_like(logits)
    out = (torch.empty(29, 8, dtype=torch.int64), torch.empty(29, 8))
    idx, weights = moe.moe_topk_gate_forward(
        logits, 6, True, 2, 1.5, ep_rank, mask=mask, bias=bias, image_bias=image_bias, image_token_mask=image_mask,
        fix_routing_mask=fix, to_physical_map=physical, logical_count=count, unmapped_topk_idx=buffer, out=out,
        scores=scores,
    )  # fmt: skip
    assert idx is out[0] and weights is out[1]
    w_ref, idx_ref, unmapped_ref, scores_ref = reference(
        logits, bias, 6, 0, 0, "sqrtsoftplus", 1.5, 2, mask, fix, unmapped, physical, count, ep_rank, ep_rank + 1, 0, 1,
        image_bias, image_mask, False,
    )  # fmt: skip
    assert torch.equal(idx, idx_ref) and torch.equal(buffer, unmapped_ref)
    torch.testing.assert_close(weights.double(), w_ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(scores[mask].double(), scores_ref[mask], rtol=1e-6, atol=1e-7)
    again = moe.moe_topk_gate(logits, 6, True, 2, 1.5, ep_rank, mask=mask, bias=bias, image_bias=image_bias,
                              image_token_mask=image_mask, fix_routing_mask=fix, to_physical_map=physical,
                              logical_count=count, unmapped_topk_idx=unmapped.clone())  # fmt: skip
    assert torch.equal(again[0], idx) and torch.equal(again[1], weights)
    with pytest.raises(AssertionError, match="sqrtsoftplus"):
        moe.moe_topk_gate_forward(logits, 6, False, 0, 1.0, 0, scoring_func="sigmoid")


def test_force_random_rows():
    """The Ascend-era kernel's random routing: every slot (shared ones too) a distinct physical id uniform over the
    physical experts, weights in (0, 1], scores 0, unmapped ids -1; other rows as without it."""
    logits, bias, *_ = _case(3, shared=0)
    force = torch.zeros(29, dtype=torch.bool)
    force[::3] = True
    buffer = torch.zeros(29, 6, dtype=torch.int64)
    scores = torch.empty_like(logits)
    idx, weights = moe.moe_topk_gate_forward(logits, 6, False, 0, 2.0, 0, bias=bias, force_random=force,
                                             unmapped_topk_idx=buffer, scores=scores)  # fmt: skip
    plain_idx, plain_w = moe.moe_topk_gate_forward(logits, 6, False, 0, 2.0, 0, bias=bias)
    assert torch.equal(idx[~force], plain_idx[~force]) and torch.equal(weights[~force], plain_w[~force])
    assert bool((buffer[force] == -1).all()) and torch.equal(buffer[~force], plain_idx[~force])
    assert bool((scores[force] == 0).all()) and bool((scores[~force] > 0).all())
    for row in idx[force]:
        assert len(set(row.tolist())) == 6 and bool(((row >= 0) & (row < 32)).all())
    assert bool(((weights[force] > 0) & (weights[force] <= 1)).all())
    # Uniform over the physical experts of a map (S' shared slots drawn as well): a chi-squared bound (the fork's).
    count = torch.randint(1, 4, (34,), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    starts = (count.cumsum(0) - count).to(torch.int32)
    physical = torch.where(torch.arange(3) < count[:, None], starts[:, None] + torch.arange(3), -1).to(torch.int32)
    many = torch.randn(3000, 32, generator=torch.Generator().manual_seed(2))
    idx, _ = moe.moe_topk_gate_forward(many, 6, True, 2, 1.5, 0, force_random=torch.ones(3000, dtype=torch.bool),
                                       to_physical_map=physical.contiguous(), logical_count=count)  # fmt: skip
    total = int(count.sum())
    hits = torch.bincount(idx.reshape(-1), minlength=total).double()
    expected = idx.numel() / total
    assert idx.max() < total and ((hits - expected) ** 2 / expected).sum() < 4 * (total - 1)


@pytest.mark.parametrize("aux", [False, True])
def test_backward_matches_autograd(aux):
    g = torch.Generator().manual_seed(7)
    tokens, experts, k = 12, 16, 4
    logits = torch.randn(tokens, experts, generator=g, dtype=torch.float64, requires_grad=True)
    u = torch.nn.functional.softplus(logits).sqrt()
    idx = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    idx[0, 1] = -1  # an unused slot
    valid = idx >= 0
    s = u.gather(1, idx.clamp(min=0)) * valid
    weights = s / (s.sum(-1, keepdim=True) + 1e-20) * 2.5
    grad_w = torch.randn(tokens, k, generator=g, dtype=torch.float64)
    loss = (weights * grad_w * valid).sum()
    mask = torch.rand(tokens, generator=g) > 0.3
    h = torch.randn(3, experts, generator=g, dtype=torch.float64)
    if aux:
        share = u / u.sum(-1, keepdim=True)
        loss = loss + (share * h.repeat_interleave(4, 0) * mask[:, None]).sum()
    want = torch.autograd.grad(loss, logits)[0]
    aux_args = {"mask": mask, "grad_scores_sum": h.float()} if aux else {}
    got = moe.moe_topk_gate_backward(u.detach().float(), idx, weights.detach().float(), grad_w.float(), 2.5, **aux_args)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
