"""The bench harness (torch_ascend_moe/bench/__init__.py): what a table says it measured is what ran (thread
count, page faults)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from torch_ascend_moe import bench


def test_page_faults_counts_fresh_pages():
    """In a fresh interpreter: what earlier tests did to this process's allocator (one run of the whole suite saw
    0 faults for a fresh 64 MiB tensor in a worker) must not decide the answer."""
    code = (
        "import torch\n"
        "from torch_ascend_moe import bench\n"
        "kept = torch.empty(16 << 20)\n"
        "print(bench.page_faults(lambda: torch.ones(16 << 20)), bench.page_faults(lambda: kept.fill_(1.0)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    fresh, reused = (float(v) for v in result.stdout.split())
    pages = 64 << 20 >> 12  # a fresh 64 MiB buffer, every 4 KiB page written
    assert fresh >= pages * 0.9 and reused < pages * 0.1, (fresh, reused)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("iterations", [0, 2], ids=["adaptive", "fixed"])
def test_cases_run_at_the_threads_asked_for(threads, iterations):
    """Both timings (torch.utils.benchmark's Timer, which runs at one thread unless told, and the fixed count) see the
    thread count the table is labelled with."""
    seen = set()

    def call():
        seen.add(torch.get_num_threads())

    case = bench.Case("threads", 1, lambda: (call, call), "itself", iterations=iterations)
    was = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        bench.run_case(case, 0.01)
    finally:
        torch.set_num_threads(was)
    assert seen == {threads}


def test_paired_seconds_gives_both_sides_a_scheduler_rhythm(monkeypatch):
    """A machine where every other call is slow whatever runs (another process on a core, in step with the calls):
    the same function timed against itself reads the same on both sides (a fixed order gave one side every slow
    call: 5.4 against 2.9 ms), and a side twice as slow reads twice the time."""
    now = [0.0]
    calls = [0]
    monkeypatch.setattr(bench, "_clock", lambda: lambda: now[0])

    def call(cost):
        def run():
            calls[0] += 1
            now[0] += cost * (2.5 if calls[0] % 2 else 1.0)  # odd calls slow

        return run

    ours, base = bench._paired_seconds(call(1e-3), call(1e-3), 0.05)
    assert ours == pytest.approx(base, rel=0.05)
    ours, base = bench._paired_seconds(call(2e-3), call(1e-3), 0.05)
    assert ours / base == pytest.approx(2.0, rel=0.05)


def test_trimmed_mean():
    assert bench._trimmed_mean([5.0]) == 5.0
    assert bench._trimmed_mean([1.0, 2.0, 3.0, 4.0, 100.0, 0.0, 2.5, 2.5, 2.5, 2.5]) == pytest.approx(2.5)
