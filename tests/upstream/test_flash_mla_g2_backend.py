"""``sparse_mla_prefill`` through FlashMLA before G3 (G2 @ 9241ae3: ``flash_mla.flash_mla_sparse_fwd`` over the
pybind ``flash_mla.cuda``; backends/upstream/flash_mla.py) with the stand-in ``flash_mla`` (tests/standins/flash_mla:
its checks and words, the kernels' top-k-block asserts as a panic, ``tests/ref.py``'s math with the documented NaN
caveat) on the CUDA chain as SM90 and SM100: which calls reach it, the outputs against our op, the reasons, a G1 build
and a loaded G3 release never used, a compiled graph reaching it, and a backend that forgets to drop the indices past
``topk_length`` caught."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from tests.upstream.standin import installed
from torch_ascend_moe.backends import chain
from torch_ascend_moe.backends.upstream import flash_mla as backend
from torch_ascend_moe.testing import calc_diff


@pytest.fixture(params=[9, 10], ids=["SM90", "SM100"])
def g2(request, monkeypatch):
    """The stand-in as the GPU of that SM major, our backend seeing the same; no G3 release loaded (another test
    registers stand-in G3 ops in this process); our Triton prefill off (a refused call reaches the portable one)."""
    monkeypatch.setattr(backend, "sm_major", lambda t: request.param)
    monkeypatch.setattr(backend, "flash_mla_op", lambda name: None)
    with installed("flash_mla", arch=request.param) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        yield lib, request.param


def _args(h_q=64, d=576, topk=128, s_q=5, s_kv=300, sink=True, lengths=True, seed=0):
    g = torch.Generator().manual_seed(seed + h_q + d + topk)
    q = (torch.randn(s_q, h_q, d, generator=g) / 3).bfloat16()
    kv = (torch.randn(s_kv, 1, d, generator=g) / 3).bfloat16()
    idx = torch.randint(-5, s_kv + 20, (s_q, 1, topk), generator=g, dtype=torch.int32)  # -1, < -1 and >= s_kv too
    idx[1] = -1  # a lonely query: out 0, lse +inf, max -inf
    attn_sink = None
    if sink:
        attn_sink = torch.randn(h_q, generator=g)
        attn_sink[0] = math.inf
    topk_length = torch.randint(0, topk + 1, (s_q,), generator=g, dtype=torch.int32) if lengths else None
    return q, kv, idx, 0.3, 512, attn_sink, topk_length


def _calls(lib) -> list[str]:
    return [name for name, _ in lib._standin.CALLS]


def _close(got, want):
    out, max_logits, lse = got
    assert calc_diff(out.float(), want[0].float()) < 1e-5, calc_diff(out.float(), want[0].float())
    for a, b in ((max_logits, want[1]), (lse, want[2])):
        assert torch.equal(a.isinf(), b.isinf()) and torch.allclose(a[a.isfinite()], b[b.isfinite()], atol=1e-4)


CASES = [
    dict(h_q=64, d=576, topk=128),
    dict(h_q=128, d=512, topk=256, sink=False),
    dict(h_q=64, d=512, topk=128, lengths=False),
    dict(h_q=128, d=576, topk=128, s_q=3),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_reaches_g2_and_equals_our_op(g2, case):
    lib, _ = g2
    args = _args(**case)
    steps = chain.explain("sparse_mla_prefill", "cuda", *args)
    chosen = [s for s in steps if s.status == "chosen"][0]
    assert chosen.kernel.calls.startswith("flash_mla.flash_mla_sparse_fwd"), steps
    got = torch.ops.ascend_moe.sparse_mla_prefill(*args)
    assert _calls(lib) == ["sparse_prefill_fwd"], _calls(lib)
    with chain.disabled("flash_mla"):
        want = torch.ops.ascend_moe.sparse_mla_prefill(*args)
    _close(got, want)


def test_refusals(g2):
    lib, arch = g2
    odd = 64 if arch == 9 else 32  # SM90 takes top-k in 128s; SM100 with 64 heads in 64s
    reasons = {
        "d_qk 640": _args(d=640),
        "32 heads": _args(h_q=32),
        "in 128s" if arch == 9 else "in 64s": _args(topk=odd),
    }
    if arch == 10:  # 128 heads past the small-top-k kernel (<= 1280, d 512): 128s
        reasons["in 128s"] = _args(h_q=128, d=576, topk=192)
    for reason, args in reasons.items():
        steps = chain.explain("sparse_mla_prefill", "cuda", *args)
        g2_step = [s for s in steps if s.kernel.calls.startswith("flash_mla.flash_mla_sparse_fwd")][0]
        assert g2_step.status == "refused" and reason in g2_step.reason, (reason, steps)
        lib._standin.reset()
        torch.ops.ascend_moe.sparse_mla_prefill(*args)
        assert not _calls(lib), (reason, _calls(lib))


def test_other_gpus_and_builds_never_used(monkeypatch):
    args = _args()
    with installed("flash_mla", arch=8) as lib, chain.on_cpu("cuda"), chain.disabled("triton"):
        monkeypatch.setattr(backend, "flash_mla_op", lambda name: None)
        monkeypatch.setattr(backend, "sm_major", lambda t: 8)
        steps = chain.explain("sparse_mla_prefill", "cuda", *args)
        assert any("SM8x" in s.reason for s in steps), steps
        monkeypatch.setattr(backend, "sm_major", lambda t: 9)
        old = inspect.signature(lib.flash_mla_sparse_fwd)
        g1 = old.replace(parameters=[p for p in old.parameters.values() if p.name not in ("attn_sink", "topk_length")])
        monkeypatch.setattr(lib.flash_mla_sparse_fwd, "__signature__", g1, raising=False)
        chain.refresh()
        steps = chain.explain("sparse_mla_prefill", "cuda", *args)
        assert any("G1" in s.reason and s.status == "not available" for s in steps), steps
        monkeypatch.undo()
        monkeypatch.setattr(backend, "sm_major", lambda t: 9)
        monkeypatch.setattr(backend, "flash_mla_op", lambda name: object())  # a G3 release loaded
        chain.refresh()
        steps = chain.explain("sparse_mla_prefill", "cuda", *args)
        g2_step = [s for s in steps if s.kernel.calls.startswith("flash_mla.flash_mla_sparse_fwd")][0]
        assert g2_step.status == "not available" and "G3" in g2_step.reason, steps
    chain.refresh()


def test_indices_past_topk_length_never_read(g2, monkeypatch):
    """Upstream: a valid index past ``topk_length`` pointing at a NaN row may poison the output; ours never reads it,
    so the backend drops those indices first (mutation: without that, NaN)."""
    lib, _ = g2
    q, kv, idx, scale, d_v, sink, lengths = _args(h_q=64, d=512, topk=128)
    idx[:, 0, -1] = 7
    lengths[:] = 100
    kv[7] = float("nan")
    idx[:, 0, :100] = torch.where(idx[:, 0, :100] == 7, 8, idx[:, 0, :100])
    args = (q, kv, idx, scale, d_v, sink, lengths)
    out = torch.ops.ascend_moe.sparse_mla_prefill(*args)[0]
    assert _calls(lib) == ["sparse_prefill_fwd"] and not out.isnan().any()
    real = backend._only_minus_one
    monkeypatch.setattr(backend, "_only_minus_one", lambda i, limit, lengths=None: real(i, limit))
    assert torch.ops.ascend_moe.sparse_mla_prefill(*args)[0].isnan().any(), "the mutation was not caught"


def test_compiled_graph_reaches_it(g2):
    lib, _ = g2
    args = _args(h_q=64, d=576, topk=128)

    def step(q, kv, idx, sink, lengths):
        return torch.ops.ascend_moe.sparse_mla_prefill(q, kv, idx, 0.3, 512, sink, lengths)[0] * 2

    tensors = (args[0], args[1], args[2], args[5], args[6])
    got = torch.compile(step, fullgraph=True, backend="aot_eager")(*tensors)
    assert "sparse_prefill_fwd" in _calls(lib), _calls(lib)
    assert torch.equal(got, step(*tensors))
