"""Values the paged MQA ops must treat alike on the eager C++ and portable kernels: one set of context_lens
gets one verdict from paged_mqa_logits and its metadata (issue 14.4: the metadata clamped a negative length
to 0 where the logits rejected it), and the cache's NaN codes decode to NaN (issue 14.2)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.mqa_logits.specs import build_paged_cache
from torch_ascend_moe.backends.portable import mqa_logits as portable

ops = torch.ops.ascend_moe  # the eager C++ kernels on CPU
_G = torch.Generator().manual_seed(71)
# Two requests of one block each (block_kv 16), so any length up to 16 is otherwise valid.
_CACHE = build_paged_cache([torch.randn(9, 64, generator=_G), torch.randn(9, 64, generator=_G)], 16, "fp8", False, _G)
_Q = torch.randn(2, 1, 4, 64).to(torch.float8_e4m3fn)
_W = torch.rand(2, 4)


def _verdict(fn) -> str | None:
    """None if the call succeeds, else its error text without the op name."""
    try:
        fn()
    except ValueError as e:
        return str(e).split(": ", 1)[1]
    return None


@settings(max_examples=30, deadline=None)
@given(lens=st.lists(st.integers(-(2**31), 16), min_size=2, max_size=2), varlen=st.booleans())
def test_same_verdict(lens, varlen):
    context_lens = torch.tensor(lens, dtype=torch.int32).view(2, 1)
    indices = torch.tensor([0, 1], dtype=torch.int32) if varlen else None
    table = _CACHE.block_table[:, :1]
    verdicts = [
        _verdict(lambda fn=fn: fn(_Q, None, _CACHE.cache, _W, context_lens, table, 16, indices, False, None))
        for fn in (ops.paged_mqa_logits, portable.paged_mqa_logits)
    ] + [
        _verdict(lambda fn=fn: fn(context_lens, 16, 4, indices))
        for fn in (ops.paged_mqa_logits_metadata, portable.paged_mqa_logits_metadata)
    ]
    assert len(set(verdicts)) == 1, verdicts
    negative = [i for i, n in enumerate(lens) if n < 0]
    if negative:
        i = negative[0]
        assert verdicts[0] == (
            f"argument 'context_lens' values: expected non-negative lengths, got context_lens[{i}, 0]={lens[i]}"
        )
    else:
        assert verdicts[0] is None


def test_paged_nan_codes_reach_their_column():
    """A UE8M0 scale of 0xFF (NaN, not 2^128) or an E4M3 NaN code in one cached token makes exactly that
    token's logits NaN, for every query of its request (issue 14.2)."""
    g = torch.Generator().manual_seed(3)
    d, block_kv, lens = 64, 16, [12, 9]
    cache = build_paged_cache([torch.randn(n, d, generator=g) for n in lens], block_kv, "fp8", True, g)
    q, w = torch.randn(2, 1, 4, d, generator=g), torch.rand(2, 4, generator=g)
    context_lens = torch.tensor(lens, dtype=torch.int32).view(2, 1)
    phys = int(cache.block_table[0, 0])
    blocks = cache.cache.view(cache.cache.shape[0], -1)
    for offset in (block_kv * d + 5 * (d // 32), 7 * d + 3):  # token 5's first scale byte; a data byte of token 7
        poisoned = blocks.clone()
        poisoned[phys, offset] = 0xFF
        kv = poisoned.view(cache.cache.shape)
        token = 5 if offset >= block_kv * d else 7
        for fn in (ops.paged_mqa_logits, portable.paged_mqa_logits):
            out = fn(q, None, kv, w, context_lens, cache.block_table, 16, None, True, None)
            expected = torch.zeros(out.shape, dtype=torch.bool)
            expected[0, token] = True
            assert torch.equal(out.isnan(), expected), fn
