"""Few-row GEMMs when the other intra-op threads arrive late (csrc/ops/tasks.h, LateThreads; issue 51).

A parallel region ends at a barrier that waits for every thread, even one that took no task. When another process
keeps a core busy, the thread sharing it starts the region late, and a GEMV of a third of a millisecond waited
milliseconds for it. After two regions in a row whose other threads took no task while the calling thread waited
past its own work, the row and streaming kernels' calls run on the calling thread alone for a while, where that
should take less than the late region did (the late region's work gives the time per unit of work); a call alone
that takes much longer than expected ends that (the calling thread shares the busy core itself), and the next
region checks again. The values are the same bits either way.

Which regions come late is the scheduler's doing, so the regions are recorded here by hand (``_C._late_threads``'s
``region``: what a region records); `bench gemm --busy` shows the real thing.
"""

import pytest
import torch

from torch_ascend_moe import _C
from torch_ascend_moe.ops.fp8_gemm import fp8_gemm
from torch_ascend_moe.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from torch_ascend_moe.testing import at_threads

MS = 1_000_000  # ns
S = 1000 * MS


def _work(m, k, n):
    """The call's work as the kernels count it for LateThreads (tasks.h's few_rows_work, summed over blocks)."""
    return n * k * (m + 4)


GEMV = _work(1, 2048, 4096)  # the calls below
LATE = (8 * MS, MS // 3, 0, GEMV)  # waited 8 ms for a thread that then took no task, after a third of a ms of work
ON_TIME = (MS // 5, MS // 3, 4, GEMV)  # the other thread took four tasks
NO_TASK_NO_WAIT = (MS // 3, MS // 3, 0, GEMV)  # nothing for the other thread, but nothing waited for either
# Late regions whose rate (1 s for a GEMV's work) no loaded test machine's GEMV alone can fall behind, whose wait
# (10 s) it stays under.
LATE_FOR_CALLS = (10 * S, S, 0, GEMV)


@pytest.fixture
def late_threads():
    """LateThreads cleared and two intra-op threads (a region needs a second one); both restored after."""
    was = torch.get_num_threads()
    _C._late_threads(True)
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(was)
    _C._late_threads(True)


def _record(*regions):
    state = None
    for region in regions:
        state = _C._late_threads(False, region)
    return state


def test_two_late_regions_in_a_row_start_calls_alone(late_threads):
    assert _record(LATE) == (1, 0, 0, 0)
    # one late region after the run ends starts the next; the calling thread's ps per unit of work from its tasks
    assert _record(LATE) == (1, 64, LATE[0], LATE[1] * 1000 // GEMV)


@pytest.mark.parametrize("between", [ON_TIME, NO_TASK_NO_WAIT], ids=["other thread took tasks", "nothing waited"])
def test_a_region_that_is_not_late_breaks_the_row(late_threads, between):
    assert _record(LATE, between, LATE)[:2] == (1, 0)
    assert _record(between, between)[:2] == (0, 0)


def _gemv_operands():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(1, 2048, generator=g).bfloat16()
    b_nt = torch.randn(4096, 2048, generator=g).bfloat16()  # K-major: the row kernel (AVX512-BF16) or streaming
    b_nn = torch.randn(2048, 4096, generator=g).bfloat16().t()  # N-major: the streaming kernel
    return a, b_nt, b_nn


@pytest.mark.parametrize("layout", ["NT", "NN"])
def test_few_row_gemms_run_alone_with_the_same_bits(late_threads, layout):
    a, b_nt, b_nn = _gemv_operands()
    b = b_nt if layout == "NT" else b_nn
    gemm = torch.ops.ascend_moe.bf16_gemm
    threads = gemm(a, b)  # a region with both threads (none recorded late yet)
    assert _C._late_threads(False)[1] == 0
    _record(LATE_FOR_CALLS, LATE_FOR_CALLS)
    alone = [gemm(a, b) for _ in range(3)]
    assert _C._late_threads(False)[1] == 61  # each call took one of the 64
    for out in alone:
        assert torch.equal(out.view(torch.int16), threads.view(torch.int16))


def test_work_expected_to_outlast_the_wait_keeps_all_threads(late_threads):
    g = torch.Generator().manual_seed(1)
    big_a = torch.randn(8, 8192, generator=g).bfloat16()
    big_b = torch.randn(32768, 8192, generator=g).bfloat16()  # 77x a GEMV's work: 77 s expected, 10 s waited
    _record(LATE_FOR_CALLS, LATE_FOR_CALLS)
    big = torch.ops.ascend_moe.bf16_gemm(big_a, big_b)
    assert _C._late_threads(False)[1] == 64  # not taken
    one = at_threads(1, lambda: torch.ops.ascend_moe.bf16_gemm(big_a, big_b))
    assert torch.equal(big.view(torch.int16), one.view(torch.int16))


def test_a_call_alone_far_slower_than_expected_ends_the_run(late_threads):
    """The calling thread was slowed itself (it shares the busy core, where the other threads take tasks)."""
    a, b, _ = _gemv_operands()
    _record((10 * S, 1, 0, GEMV), (10 * S, 1, 0, GEMV))  # expected: 0 ns; any real GEMV takes longer than 20 us
    torch.ops.ascend_moe.bf16_gemm(a, b)
    assert _C._late_threads(False)[:2] == (0, 0)


def test_fp8_decode_runs_alone_too(late_threads):
    g = torch.Generator().manual_seed(2)
    a, sfa = per_token_cast_to_fp8(torch.randn(1, 2048, generator=g), use_ue8m0=False)
    b, sfb = per_block_cast_to_fp8(torch.randn(4096, 2048, generator=g), use_ue8m0=False)
    threads = fp8_gemm(a, sfa, b, sfb)
    _record(LATE_FOR_CALLS, LATE_FOR_CALLS)  # the same work as a GEMV of this shape
    alone = fp8_gemm(a, sfa, b, sfb)
    assert _C._late_threads(False)[1] == 63
    assert torch.equal(alone, threads)


def test_panel_and_onednn_calls_never_run_alone(late_threads):
    """Their tasks open regions of their own (SGEMM, copies, oneDNN): taken alone outside a region, each task would
    open one; they keep every region."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(64, 1024, generator=g).bfloat16(), torch.randn(1024, 1024, generator=g).bfloat16()
    a8, sfa = per_token_cast_to_fp8(torch.randn(64, 1024, generator=g), use_ue8m0=False)
    b8, sfb = per_block_cast_to_fp8(torch.randn(1024, 1024, generator=g), use_ue8m0=False)
    _record(LATE_FOR_CALLS, LATE_FOR_CALLS)
    was = _C._set_native_bf16_dot(0)  # 64 rows: FP32 panels, not oneDNN's GEMM
    try:
        torch.ops.ascend_moe.bf16_gemm(a, b)
    finally:
        _C._set_native_bf16_dot(was)
    fp8_gemm(a8, sfa, b8, sfb)  # 64 rows: dequantized panels
    assert _C._late_threads(False)[1] == 64


def test_one_thread_records_nothing(late_threads):
    a, b, _ = _gemv_operands()
    at_threads(1, lambda: [torch.ops.ascend_moe.bf16_gemm(a, b) for _ in range(4)])
    assert _C._late_threads(False) == (0, 0, 0, 0)
