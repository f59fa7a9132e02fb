"""``bench mega_moe``: its baseline is the op's own pipeline written step by step (equal to the op bit for bit on
the bench's quick shape), and its cases run."""

from __future__ import annotations

import torch

from torch_ascend_moe import bench
from torch_ascend_moe.bench import mega_moe as mega_bench


def test_baseline_is_the_unfused_pipeline_and_cases_run():
    (case,) = mega_bench.cases(quick=True)
    ours, baseline = case.setup()
    assert torch.equal(ours(), baseline())
    result = bench.run_case(case, 0.01)
    assert result.ours_ms > 0 and result.baseline_ms > 0
