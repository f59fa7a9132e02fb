"""nn.LightningIndexer: quantized inference and straight-through training agree, top-k follows the logits,
the KL (distillation) loss trains it towards a dense attention teacher, and it compiles."""

from __future__ import annotations

import pytest
import torch

from torch_ascend_moe.nn import LightningIndexer, indexer_kl_loss
from torch_ascend_moe.testing import calc_diff


def _setup(quant, t=48, hidden=64, seed=0):
    torch.manual_seed(seed)
    indexer = LightningIndexer(hidden, num_heads=4, head_dim=32, topk=8, quant=quant)
    x = torch.randn(t, hidden)
    ks, ke = torch.zeros(t, dtype=torch.int32), torch.arange(1, t + 1, dtype=torch.int32)  # causal, self included
    return indexer, x, ks, ke


@pytest.mark.parametrize("quant", [None, "fp8", "fp4"])
def test_inference_and_training_paths_agree(quant):
    indexer, x, ks, ke = _setup(quant)
    with torch.no_grad():
        idx, logits = indexer(x, ks, ke)  # real FP8/FP4 operands
    train_logits = indexer.logits(x, ks, ke)  # fake-quantized FP32 operands, with a graph
    assert train_logits.requires_grad
    finite = torch.isfinite(logits)
    assert torch.equal(finite, torch.isfinite(train_logits))
    assert calc_diff(logits[finite], train_logits.detach()[finite]) < 1e-10
    values, expected = torch.ops.ascend_moe.mqa_topk(logits, ks, ke, 8)
    assert torch.equal(idx, expected)
    assert torch.equal(idx >= 0, torch.arange(8) < ke[:, None])  # early queries see fewer than topk tokens


@pytest.mark.parametrize("quant", [None, "fp8", "fp4"])
def test_select_is_forwards_top_k_without_the_logits(quant):
    """``select`` (mqa_logits_topk) gives forward's indices and the logits at them, in inference and training."""
    indexer, x, ks, ke = _setup(quant)
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            idx, logits = indexer(x, ks, ke)
            scores, sel = indexer.select(x, ks, ke)
        assert torch.equal(sel, idx)
        valid = idx >= 0
        gathered = logits.gather(1, idx.long().clamp(min=0))
        assert torch.equal(scores[valid], gathered[valid]) and (scores[~valid] == float("-inf")).all()
        assert scores.requires_grad == grad


def test_quantization_changes_the_scores_a_little():
    indexer, x, ks, ke = _setup(None)
    with torch.no_grad():
        exact = indexer.logits(x, ks, ke)
        indexer.quant = "fp8"
        fp8 = indexer.logits(x, ks, ke)
    finite = torch.isfinite(exact)
    assert 0 < calc_diff(fp8[finite], exact[finite]) < 1e-3


def _teacher(x, ks, ke, heads=4, dim=16, seed=1):
    """Dense attention probabilities of a fixed random attention layer, summed over heads."""
    g = torch.Generator().manual_seed(seed)
    wq, wk = torch.randn(x.shape[1], heads * dim, generator=g), torch.randn(x.shape[1], dim, generator=g)
    q, k = (x @ wq).view(x.shape[0], heads, dim), x @ wk
    scores = torch.einsum("thd,sd->hts", q, k) / dim**0.5
    j = torch.arange(x.shape[0])
    mask = (j >= ks[:, None]) & (j < ke[:, None])
    return scores.masked_fill(~mask, float("-inf")).softmax(-1).sum(0)


@pytest.mark.parametrize("quant", ["fp8", "fp4"])
def test_kl_distillation_trains_the_indexer(quant):
    indexer, x, ks, ke = _setup(quant)
    target = _teacher(x, ks, ke)
    opt = torch.optim.Adam(indexer.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        loss = indexer_kl_loss(indexer.logits(x, ks, ke), target)
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in indexer.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], (losses[0], losses[-1])
    # The trained indexer's top-k recovers more of the teacher's attention mass than at the start.
    with torch.no_grad():
        idx, _ = indexer(x, ks, ke)
    mass = torch.where(idx >= 0, target.gather(1, idx.clamp(min=0).long()), 0).sum(1) / target.sum(1)
    assert mass.mean() > 0.6


def test_kl_loss_matches_its_definition():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(5, 7, generator=g, dtype=torch.float64)
    ks, ke = torch.tensor([0, 1, 2, 0, 3]), torch.tensor([7, 4, 3, 0, 7])
    j = torch.arange(7)
    mask = (j >= ks[:, None]) & (j < ke[:, None])
    logits = logits.masked_fill(~mask, float("-inf"))
    target = torch.rand(5, 7, generator=g, dtype=torch.float64) * mask
    expected = 0.0
    for i in range(5):
        if mask[i].any():
            p = target[i][mask[i]] / target[i][mask[i]].sum()
            expected += float((p * (p.log() - logits[i][mask[i]].log_softmax(-1))).sum())
    assert abs(indexer_kl_loss(logits, target).item() - expected / 5) < 1e-12


def test_compiles_fullgraph_forward_and_backward():
    indexer, x, ks, ke = _setup("fp8")
    target = _teacher(x, ks, ke)

    def step(x):
        return indexer_kl_loss(indexer.logits(x, ks, ke), target)

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True)
    eager_loss = step(x)
    eager_grads = torch.autograd.grad(eager_loss, list(indexer.parameters()))
    loss = compiled(x)
    grads = torch.autograd.grad(loss, list(indexer.parameters()))
    torch.testing.assert_close(loss, eager_loss, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"argument 'quant' value: expected 'fp8', 'fp4' or None, got 'int8'"):
        LightningIndexer(64, quant="int8")
    with pytest.raises(ValueError, match=r"argument 'head_dim' value: expected a multiple of 32, got 48"):
        LightningIndexer(64, head_dim=48, quant="fp4")
