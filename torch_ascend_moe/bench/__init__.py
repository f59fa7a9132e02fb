"""Benchmarks: ``python -m torch_ascend_moe bench <family>``.

Each family module exposes ``cases(quick) -> list[Case]``. A case times our op and a baseline in the same
run (machines here are noisy: only the ratio is meaningful) with ``torch.utils.benchmark``.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable

import torch
from torch.utils import benchmark

FAMILIES = ("gemm", "fp8_gemm", "fp8_linear", "grouped")
# Names that run several families: ``bench fp8`` covers every FP8 op.
GROUPS = {"fp8": ("fp8_gemm", "fp8_linear")}


@dataclasses.dataclass
class Case:
    name: str
    flops: int
    setup: Callable[[], tuple[Callable[[], object], Callable[[], object]]]  # -> (ours, baseline)
    baseline: str


@dataclasses.dataclass
class Result:
    case: str
    baseline: str
    ours_ms: float
    baseline_ms: float
    ours_tflops: float
    baseline_tflops: float

    @property
    def speedup(self) -> float:
        """Baseline time over ours: above 1 means our op is faster."""
        return self.baseline_ms / self.ours_ms


def _median_seconds(fn: Callable[[], object], min_run_time: float) -> float:
    return benchmark.Timer(stmt="fn()", globals={"fn": fn}).blocked_autorange(min_run_time=min_run_time).median


def run_case(case: Case, min_run_time: float = 0.3) -> Result:
    ours, base = case.setup()
    with torch.no_grad():
        # Interleave so that drift in machine load hits both sides alike.
        t_ours = _median_seconds(ours, min_run_time)
        t_base = _median_seconds(base, min_run_time)
        t_ours = min(t_ours, _median_seconds(ours, min_run_time))
        t_base = min(t_base, _median_seconds(base, min_run_time))
    return Result(
        case.name, case.baseline, t_ours * 1e3, t_base * 1e3, case.flops / t_ours / 1e12, case.flops / t_base / 1e12
    )


def cases(family: str, quick: bool = False) -> list[Case]:
    if family in GROUPS:
        return [c for f in GROUPS[family] for c in cases(f, quick)]
    if family not in FAMILIES:
        expected = ", ".join((*FAMILIES, *GROUPS))
        raise ValueError(f"bench: argument 'family' value: expected one of {expected}, got {family!r}")
    return importlib.import_module(f"torch_ascend_moe.bench.{family}").cases(quick)
