"""The CPU GEMM workers' one parallel region per call (csrc/ops/tasks.h, issue 51): every expert's column blocks
are tasks that the intra-op threads take one at a time.

What must hold whatever the thread count: the same bits (each block's SGEMM runs on one thread, so the blocking
cannot change a sum's order), and the caller's dispatch state in the other threads (a kernel runs below autograd;
a worker thread without that state would send the tasks' ATen ops on tensors that require grad through autograd).
"""

from __future__ import annotations

import functools

import pytest
import torch

from tests.fp8_gemm.specs import quantize
from tests.grouped.specs import psum_layout
from torch_ascend_moe.testing import at_threads

ops = torch.ops.ascend_moe
BF16 = torch.bfloat16
_FP8 = (("fp8-token", 1, 128, False), ("fp8-block", 128, 128, False))


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(BF16)


def _calls():
    """(label, call) pairs large enough for two threads (2^21 multiply-adds or more: twice tasks.h's
    kMinWorkPerThread), on the panel and the streaming paths, dense and grouped, BF16 and FP8."""
    a, b = _randn(96, 512, seed=1), _randn(640, 512, seed=2)
    c = _randn(96, 640, seed=3)
    x = _randn(6, 1024, seed=4)
    layout, rows = psum_layout([40, 0, 7, 90, 3], 1)
    ga, gb = _randn(rows, 512, seed=5), _randn(5, 384, 512, seed=6)
    kb = _randn(rows, 256, seed=7)
    masked = torch.tensor([3, 64, 0, 17], dtype=torch.int32)
    ma, mb = _randn(4, 64, 512, seed=8), _randn(4, 320, 512, seed=9)
    qa, sfa, ra = quantize(torch.randn(80, 512, generator=torch.Generator().manual_seed(10)), _FP8[0])
    qb, sfb, rb = quantize(torch.randn(5, 384, 512, generator=torch.Generator().manual_seed(11)).flatten(0, 1), _FP8[1])
    qb, sfb = qb.view(5, 384, 512), sfb.view(5, 3, 4)
    da, dsa, _ = quantize(torch.randn(3, 1024, generator=torch.Generator().manual_seed(13)), _FP8[0])
    db, dsb, _ = quantize(torch.randn(2048, 1024, generator=torch.Generator().manual_seed(14)), _FP8[1])
    fp8_layout, fp8_rows = psum_layout([20, 2, 0, 51, 7], 1)
    assert fp8_rows == 80
    return [
        ("bf16_gemm panels +C", lambda: ops.bf16_gemm(a, b, c, 0.5)),
        ("bf16_gemm panels fp32 out", lambda: ops.bf16_gemm(a, b.t().contiguous().t(), out_dtype=torch.float32)),
        ("bf16_gemm streaming", lambda: ops.bf16_gemm(x, _randn(1024, 1024, seed=12), None, 2.0)),
        ("bf16_gemm streaming MN-major", lambda: ops.bf16_gemm(x, _randn(1024, 1024, seed=12).t())),
        ("m_grouped_bf16_gemm", lambda: ops.m_grouped_bf16_gemm(ga, gb, layout)),
        ("m_grouped_bf16_gemm_masked", lambda: ops.m_grouped_bf16_gemm_masked(ma, mb, masked)),
        ("k_grouped_bf16_gemm", lambda: ops.k_grouped_bf16_gemm(ga, kb, layout, 5)),
        ("k_grouped_bf16_gemm +C", lambda: ops.k_grouped_bf16_gemm(ga, kb, layout, 5, c=torch.ones(5, 512, 256))),
        ("fp8_gemm", lambda: ops.fp8_gemm(qa, sfa, qb[0], sfb[0], None, ra, rb)),
        ("fp8_gemm decode", lambda: ops.fp8_gemm(da, dsa, db, dsb, None, ra, rb, 0.5)),
        ("m_grouped_fp8_gemm", lambda: ops.m_grouped_fp8_gemm(qa, sfa, qb, sfb, fp8_layout, True, 1, ra, rb)),
    ]


@pytest.mark.parametrize("label,call", _calls(), ids=[label for label, _ in _calls()])
def test_same_bits_at_one_and_two_threads(label, call):
    one, two = at_threads(1, call), at_threads(2, call)
    assert one.dtype == two.dtype and one.shape == two.shape
    assert torch.equal(
        one.view(torch.uint8) if one.dtype == BF16 else one, two.view(torch.uint8) if two.dtype == BF16 else two
    ), label


def test_tasks_keep_the_callers_dispatch_state():
    """Operands that require grad reach the kernel below autograd; the tasks' ATen ops on other threads must stay
    there too (they raised "functions with out=... arguments don't support automatic differentiation" before)."""
    a = _randn(96, 512, seed=1).requires_grad_()
    b = _randn(640, 512, seed=2).requires_grad_()
    layout, rows = psum_layout([40, 0, 7, 90, 3], 1)
    ga = _randn(rows, 512, seed=5).requires_grad_()
    gb = _randn(5, 384, 512, seed=6).requires_grad_()

    def run():
        out = ops.bf16_gemm(a, b)
        grouped = ops.m_grouped_bf16_gemm(ga, gb, layout)
        (out.float().sum() + grouped.float().sum()).backward()
        return out.detach(), a.grad, b.grad, ga.grad, gb.grad

    out, ag, bg, gag, gbg = at_threads(2, run)
    assert out.requires_grad is False and ag is not None and bg is not None and gag is not None and gbg is not None
    torch.testing.assert_close(ag.float(), b.detach().float().sum(0).expand(96, 512), rtol=1e-2, atol=1e-2)


def _sgemm_calls(fn) -> int:
    with torch.profiler.profile() as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "aten::addmm")


@pytest.fixture
def panel_path():
    """The panel path on every CPU: one with BF16 dot products hands these BF16 jobs to ATen's BF16 GEMM whole."""
    from torch_ascend_moe import _C

    previous = _C._set_native_bf16_dot(0)
    yield
    _C._set_native_bf16_dot(previous)


def test_tasks_are_sized_by_the_whole_calls_work(panel_path):
    """Column blocks for about four tasks per thread over the call's jobs, in proportion to each job's work, none
    under tasks.h's kMinTaskWork: four 32x128x128 experts run as 8 SGEMMs (they were 32 of 16 columns, 4x the
    time), a 16-expert call with one expert holding half the rows splits that expert most."""
    w = _randn(4, 128, 128, seed=7)
    x = _randn(128, 128, seed=8)
    offs = torch.tensor([32, 64, 96, 128], dtype=torch.int32)
    small = at_threads(2, lambda: _sgemm_calls(lambda: ops.m_grouped_bf16_gemm(x, w, offs, out_dtype=BF16)))
    assert small <= 8
    rows = [512] + [32] * 15  # expert 0 has half the rows
    offs = torch.tensor(rows, dtype=torch.int32).cumsum(0).int()
    x, w = _randn(sum(rows), 512, seed=9), _randn(16, 1024, 512, seed=10)
    blocks = []

    def run():
        with torch.profiler.profile(record_shapes=True) as prof:
            ops.m_grouped_bf16_gemm(x, w, offs, out_dtype=BF16)
        blocks.extend(e for e in prof.events() if e.name == "aten::addmm")

    at_threads(2, run)
    shapes = [tuple(e.input_shapes[1]) for e in blocks]  # A's rows and K per SGEMM
    hot = sum(s[0] == 512 for s in shapes)
    assert hot >= 4 and len(shapes) - hot <= 2 * 15, shapes  # the hot expert split, the others mostly whole


def test_native_experts_run_as_tasks_with_the_same_bits():
    """On the native BF16 path (forced here: ATen's BF16 GEMM, emulated on CPUs without BF16 dot products) the experts
    of one call run as tasks of one region, each ATen GEMM on one thread; an expert above a thread's share of the
    call keeps ATen's threads. Each expert's rows are bit for bit ATen's GEMM run that way."""
    from torch_ascend_moe import _C

    def per_expert(a, w, bounds, threads):
        pairs = list(zip(bounds, bounds[1:]))
        return at_threads(threads, lambda: [a[s:e] @ w[g].t() for g, (s, e) in enumerate(pairs)])

    previous = _C._set_native_bf16_dot(1)
    try:
        # Equal experts; expert 0 above half of the work. More than 16 rows each: fewer take the row kernel where the
        # CPU has AVX512-BF16 (tests/gemm/test_dot_rows.py).
        for rows in ([32] * 6, [200, 17, 24, 18, 40, 20]):
            layout, total = psum_layout(rows, 1)
            a, w = _randn(total, 256, seed=20), _randn(len(rows), 384, 256, seed=21)
            bounds = [0, *layout.tolist()]
            alone, threaded = per_expert(a, w, bounds, 1), per_expert(a, w, bounds, 2)
            for threads in (1, 2):
                got = at_threads(threads, functools.partial(ops.m_grouped_bf16_gemm, a, w, layout))
                for g, (s, e) in enumerate(zip(bounds, bounds[1:])):
                    whole = threads == 2 and rows[g] * 2 > total
                    want = threaded[g] if whole else alone[g]
                    assert torch.equal(got[s:e].view(torch.int16), want.view(torch.int16)), (rows, threads, g)
    finally:
        _C._set_native_bf16_dot(previous)
