"""Benchmark cases of the topk_select family against ``torch.topk`` on the same rows (DeepSelect's comparison):
the indexer (BF16, per-query KV positions, unsorted) and the sampler (FP32, one vocabulary, sorted)."""

from __future__ import annotations

import torch

from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.topk_select import topk_select


def _case(rows: int, columns: int, k: int, dtype: torch.dtype, sorted: bool, label: str) -> Case:
    def setup():
        x = torch.randn(rows, columns).to(dtype)
        return (lambda: topk_select(x, k, sorted=sorted)), (lambda: torch.topk(x, k, dim=1, sorted=sorted))

    name = f"{label} {str(dtype).removeprefix('torch.')} {rows}x{columns} k{k}{' sorted' if sorted else ''}"
    return Case(name, rows * columns, setup, "torch.topk")


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [
            _case(8, 8192, 512, torch.bfloat16, False, "indexer"),
            _case(4, 32768, 512, torch.float32, True, "sampler"),
        ]
    return [
        _case(256, 16384, 512, torch.bfloat16, False, "indexer"),
        _case(64, 131072, 2048, torch.bfloat16, False, "indexer"),
        _case(6, 1048576, 1024, torch.bfloat16, False, "indexer"),
        _case(256, 129280, 512, torch.float32, True, "sampler"),
        _case(6, 129280, 4096, torch.float32, True, "sampler"),
    ]
