"""FlashMLA ``nv_dev``'s ``flash_mla_sparse_fwd(..., indexer_topk=)`` (specs/upstream_2609.md §7.1) on our compat
package: ``lse_indexer`` is the natural-log LSE of the scaled scores over the first ``indexer_topk`` indices only
(invalid ones and positions past ``topk_length`` excluded, no sink), checked against an fp64 computation; +inf for an
empty set and when ``topk < indexer_topk``; the first three outputs unchanged."""

from __future__ import annotations

import pytest
import torch

import torch_ascend_moe.flash_mla as flash_mla


def _lse64(q, kv, idx, scale, lengths):
    s_q, h = q.shape[0], q.shape[1]
    out = torch.full((s_q, h), float("inf"), dtype=torch.float64)
    for t in range(s_q):
        rows = [int(i) for p, i in enumerate(idx[t, 0].tolist()) if 0 <= i < kv.shape[0] and p < lengths[t]]
        if rows:
            scores = q[t].double() @ kv[rows, 0].double().T * scale
            out[t] = torch.logsumexp(scores, dim=-1)
    return out


def test_lse_indexer_over_the_first_entries():
    g = torch.Generator().manual_seed(1)
    s_q, h, d, s_kv, topk = 5, 4, 64, 3000, 640
    q = torch.randn(s_q, h, d, generator=g).bfloat16()
    kv = torch.randn(s_kv, 1, d, generator=g).bfloat16()
    idx = torch.randint(-5, s_kv + 5, (s_q, 1, topk), generator=g, dtype=torch.int32)
    idx[3, 0, :512] = -1  # an empty indexer set
    lengths = torch.tensor([640, 300, 600, 640, 0], dtype=torch.int32)
    sink = torch.randn(h, generator=g)
    out, max_logits, lse, lse_indexer = flash_mla.flash_mla_sparse_fwd(
        q, kv, idx, 0.125, 32, attn_sink=sink, topk_length=lengths, indexer_topk=512
    )
    plain = flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.125, 32, attn_sink=sink, topk_length=lengths)
    for a, b in zip((out, max_logits, lse), plain):
        assert torch.equal(a, b)
    want = _lse64(q, kv, idx[..., :512], 0.125, lengths.clamp(max=512).tolist())
    assert lse_indexer.dtype == torch.float32 and lse_indexer.shape == (s_q, h) and lse_indexer.is_contiguous()
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(lse_indexer), finite) and not finite[3].any() and not finite[4].any()
    torch.testing.assert_close(lse_indexer[finite].double(), want[finite], rtol=0, atol=1e-4)


def test_fewer_indices_than_indexer_topk_and_bad_values():
    q, kv = torch.randn(2, 2, 64).bfloat16(), torch.randn(10, 1, 64).bfloat16()
    idx = torch.zeros(2, 1, 128, dtype=torch.int32)
    *_, lse_indexer = flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.1, 32, indexer_topk=512)
    assert bool(torch.isinf(lse_indexer).all()) and bool((lse_indexer > 0).all())
    with pytest.raises(ValueError, match=r"argument 'indexer_topk' value: expected 0, 512, 1024 or 2048, got 256"):
        flash_mla.flash_mla_sparse_fwd(q, kv, idx, 0.1, 32, indexer_topk=256)
