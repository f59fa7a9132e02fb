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
