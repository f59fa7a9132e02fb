"""``nn.DSAttention`` (DeepSeek Sparse Attention, MLA absorbed form): the prefill equal to dense attention with the
indexer's selection as a mask (fp64), trainable except the selection, one graph under torch.compile, and a varlen
batch's sequences independent of each other; the paged decode (``decode`` over a ``PagedDSACache``) the same
function of the tokens as the prefill, step by step, in BF16 rows or FP8 records, compiled too."""

from __future__ import annotations

import pytest
import torch

from tests.sparse_mla.specs import _dequantized
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


def _decode_steps(m, x, cache, first: int, step: int = 1, run=None):
    """The prompt's first ``first`` tokens in one call, then ``step`` tokens at a time."""
    run = run or m.decode
    outs = [run(x[:, :first], cache)]
    outs += [run(x[:, t : t + step], cache) for t in range(first, x.shape[1], step)]
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize(("quant", "step"), [("fp8", 1), ("fp4", 3)])
def test_paged_decode_equals_the_prefill(quant, step):
    """Prompt then generation through the pages (random block order, pages of 5 so requests span blocks, topk below
    the length so the indexer really selects): each token's output equals ``forward`` over the whole sequence,
    per request; the cache holds what was written."""
    torch.manual_seed(4)
    m = DSAttention(64, 4, kv_lora_rank=32, rope_dim=8, v_head_dim=16, topk=6, indexer_heads=4, indexer_head_dim=32,
                    indexer_quant=quant)  # fmt: skip
    x = torch.randn(3, 22, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = torch.stack([m(x[i]) for i in range(3)])
        cache = m.new_cache(3, 30, page=5)
        got = _decode_steps(m, x, cache, 7, step)
        assert cache.lengths.tolist() == [22, 22, 22]
        _, kv = m.latents(x[1])
        rows = cache.kv.view(-1, 40)[cache.records(torch.arange(22)[None].expand(3, 22))[1]]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rows, kv[:, 0], rtol=1e-6, atol=1e-6)  # (a GEMM of other rows: other blocking)


def test_paged_decode_over_fp8_records():
    """DeepSeek-V3.2's geometry (latent 512 + RoPE 64) with the 656-byte FP8 records through ``sparse_mla_decode``:
    the records read back (independently of the op) are the latent rows to FP8's rounding, and the output is the
    prefill's to that rounding; one request's output does not depend on the others in the batch."""
    torch.manual_seed(6)
    m = DSAttention(64, 2, kv_lora_rank=512, rope_dim=64, v_head_dim=16, topk=8, indexer_heads=4, indexer_head_dim=64)
    x = torch.randn(2, 18, 64, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        want = torch.stack([m(x[i]) for i in range(2)])
        cache = m.new_cache(2, 20, page=4, kv_format="fp8")
        got = _decode_steps(m, x, cache, 6, 4)
        alone = _decode_steps(m, x[1:], m.new_cache(1, 20, page=4, kv_format="fp8"), 6, 4)
        _, kv = m.latents(x[0])
        records = cache.records(torch.arange(18)[None].expand(2, 18))[0].tolist()
        back = torch.stack([_dequantized(cache.kv, r) for r in records])
    assert calc_diff(back, kv[:, 0]) < 1e-3 and (back[:, 512:] == kv[:, 0, 512:].bfloat16().double()).all()
    assert calc_diff(got, want) < 2e-3
    torch.testing.assert_close(got[1], alone[0], rtol=1e-6, atol=1e-6)


def test_paged_decode_compiles():
    """``torch.compile(decode, fullgraph=True)``: one graph per step shape (no host read: the logits span the
    cache's capacity), the same outputs and cache rows as eager."""
    torch.manual_seed(8)
    m = _module(torch.float32)
    x = torch.randn(2, 12, 64, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        eager_cache, compiled_cache = m.new_cache(2, 16, page=4), m.new_cache(2, 16, page=4)
        compiled_cache.block_table.copy_(eager_cache.block_table)
        torch._dynamo.reset()
        eager = _decode_steps(m, x, eager_cache, 4)
        compiled = _decode_steps(m, x, compiled_cache, 4, run=torch.compile(m.decode, fullgraph=True))
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_cache.kv, eager_cache.kv, rtol=1e-5, atol=1e-5)  # Inductor's fused RoPE
    assert torch.equal(compiled_cache.lengths, eager_cache.lengths)


def test_paged_cache_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="'fp8' \\(DeepSeek-V3.2's 656-byte records\\) needs kv_lora_rank 512"):
        _module(torch.float32).new_cache(1, 8, kv_format="fp8")
    with pytest.raises(ValueError, match="argument 'kv_format' value: expected 'bf16' or 'fp8'"):
        _module(torch.float32).new_cache(1, 8, kv_format="fp16")
    m = DSAttention(64, 2, kv_lora_rank=16, rope_dim=8, v_head_dim=8, topk=4, indexer_heads=2, indexer_head_dim=32,
                    indexer_quant=None)  # fmt: skip
    with pytest.raises(ValueError, match="indexer must quantize its keys"):
        m.new_cache(1, 8)


def test_zero_tokens_and_bad_inputs():
    """0 tokens (a prefill of none, a decode step of none or for no request) give empty outputs; misuse names the
    module's argument instead of failing inside a reshape or a GEMM."""
    m = DSAttention(16, 2, kv_lora_rank=16, rope_dim=8, v_head_dim=8, topk=3, indexer_heads=2, indexer_head_dim=32)
    with torch.no_grad():
        assert m(torch.empty(0, 16)).shape == (0, 16)
        assert m.indexer(torch.empty(0, 16), *(torch.zeros(0, dtype=torch.int32),) * 2)[0].shape[0] == 0
        assert m.decode(torch.empty(2, 0, 16), m.new_cache(2, 8, 4)).shape == (2, 0, 16)
        assert m.decode(torch.empty(0, 1, 16), m.new_cache(0, 8, 4)).shape == (0, 1, 16)
        for call, text in (
            (lambda: m(torch.randn(1, 4, 16)), r"DSAttention: argument 'x' shape: expected \[T, hidden_size=16\]"),
            (lambda: m(torch.randn(4, 15)), r"DSAttention: argument 'x' shape"),
            (lambda: m(torch.randn(4, 16), positions=torch.arange(3)), r"argument 'positions' shape: expected \[T=4\]"),
            (lambda: m.indexer(torch.randn(1, 4, 16), None, None), r"LightningIndexer: argument 'x' shape"),
            (lambda: m.new_cache(1, 8, page=0), r"PagedDSACache: argument 'page' value: expected a positive integer"),
            (lambda: m.decode(torch.randn(1, 9, 16), m.new_cache(1, 8, 4)), r"size\(1\): expected at most 8 tokens"),
            (lambda: m.decode(torch.randn(2, 1, 16), m.new_cache(1, 8, 4)), r"size\(0\): expected the cache's batch"),
            (lambda: m.decode(torch.randn(2, 16), m.new_cache(2, 8, 4)), r"DSAttention.decode: argument 'x' rank"),
        ):
            with pytest.raises(ValueError, match=text):
                call()
