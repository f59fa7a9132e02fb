"""``nn.DSAttention`` (DeepSeek Sparse Attention, MLA absorbed form, prefill): equal to dense attention with the
indexer's selection as a mask (fp64), trainable except the selection, one graph under torch.compile, and a varlen
batch's sequences independent of each other."""

from __future__ import annotations

import torch

from torch_ascend_moe.nn import DSAttention
from torch_ascend_moe.testing import calc_diff


def _module(dtype=torch.float64, topk=6):
    torch.manual_seed(0)
    m = DSAttention(64, 4, kv_lora_rank=32, rope_dim=8, v_head_dim=16, topk=topk, indexer_heads=4, indexer_head_dim=32)
    return m.to(dtype)


def test_equals_dense_attention_over_the_selection():
    m = _module()
    x = torch.randn(20, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = m(x)
        q, kv = m.latents(x)
        idx = m.indices(x)
        mask = torch.zeros(20, 21, dtype=torch.bool)
        mask.scatter_(1, torch.where(idx >= 0, idx.long(), 20), True)
        scores = torch.einsum("thd,sd->hts", q, kv[:, 0]) * m.scale
        p = torch.softmax(scores.masked_fill(~mask[:, :20], -torch.inf), dim=-1)
        latent = torch.einsum("hts,sr->thr", p, kv[:, 0, : m.kv_lora_rank])
        want = m.wo(torch.einsum("thr,hrv->thv", latent, m.w_uv).reshape(20, -1))
    assert (idx >= 0).sum(-1).min() >= 1 and (idx < 0).any()  # early tokens see fewer than topk
    assert calc_diff(got, want) < 1e-20


def test_trains_and_compiles():
    m = _module(torch.float32)
    x = torch.randn(16, 64, generator=torch.Generator().manual_seed(2))
    m(x).square().sum().backward()
    for name, p in m.named_parameters():
        assert (p.grad is not None) != name.startswith("indexer."), name  # the selection is not differentiable
    with torch.no_grad():
        eager = m(x)
        torch._dynamo.reset()
        compiled = torch.compile(m, fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)


def test_varlen_sequences_do_not_see_each_other():
    m = _module()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(14, 64, dtype=torch.float64, generator=g)
    starts = torch.tensor([0] * 6 + [6] * 8, dtype=torch.int32)
    ends = torch.cat([torch.arange(1, 7), torch.arange(7, 15)]).to(torch.int32)
    positions = torch.cat([torch.arange(6), torch.arange(8)])
    with torch.no_grad():
        y = m(x, starts, ends, positions)
        x2 = x.clone()
        x2[:6] = torch.randn(6, 64, dtype=torch.float64, generator=g)
        y2 = m(x2, starts, ends, positions)
        alone = m(x[6:])
    assert torch.equal(y[6:], y2[6:])
    assert calc_diff(y[6:], alone) < 1e-20  # the second sequence as if it were alone
