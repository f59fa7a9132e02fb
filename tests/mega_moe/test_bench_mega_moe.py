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


def test_bench_moe_times_megamoe_against_moe_with_page_faults():
    """``bench moe``'s nn.MegaMoE rows: the same weights as nn.MoE (outputs within MegaMoE's one extra rounding),
    BF16 forward and forward+backward, FP8 forward (both modules ``fp8=True``, each its FP8 recipe), each with page
    faults per step."""
    from torch_ascend_moe.bench import moe as moe_bench
    from torch_ascend_moe.testing import calc_diff

    rows = [c for c in moe_bench.cases(quick=True) if c.name.startswith("MegaMoE")]
    assert [c.grad for c in rows] == [False, True, False, True, False, False] and all(c.faults for c in rows)
    assert sum("shared" in c.name for c in rows) == 3 and [" fp8 " in c.name for c in rows] == [False] * 4 + [True] * 2
    ours, baseline = rows[2].setup()
    assert calc_diff(ours(), baseline()) < 1e-4
    ours, baseline = rows[5].setup()
    assert calc_diff(ours(), baseline()) < 2e-3  # two FP8 recipes
    result = bench.run_case(rows[3], 0.01)
    assert result.ours_faults is not None and result.baseline_faults is not None
