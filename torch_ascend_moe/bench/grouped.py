"""Benchmark cases of the grouped and moe_routing families on MoE-like shapes with skewed expert loads.

Baselines, measured in the same run: a per-expert Python loop of ``torch.mm`` (what a plain PyTorch MoE
does) and ``torch._grouped_mm`` (PyTorch's grouped GEMM, with the same psum ``offs``), both in BF16, and for 256
experts one dense ``bf16_gemm`` of the same rows (what grouping them costs); the
routing ops against the same permutation written with torch ops (sort + index copy).
"""

from __future__ import annotations

import torch

from torch_ascend_moe.backends.portable import moe_routing as torch_routing
from torch_ascend_moe.bench import Case
from torch_ascend_moe.ops.gemm import bf16_gemm
from torch_ascend_moe.ops.grouped import k_grouped_bf16_gemm, m_grouped_bf16_gemm
from torch_ascend_moe.ops.moe_routing import moe_permute, moe_unpermute


def _psum(counts: list[int]) -> tuple[torch.Tensor, int]:
    """(cumulative ends as int32, total rows) of contiguous groups of ``counts`` rows (no alignment gaps)."""
    ends = torch.tensor(counts, dtype=torch.int64).cumsum(0).to(torch.int32)
    return ends, sum(counts)


def _skewed_counts(experts: int, tokens: int, seed: int) -> list[int]:
    """Token counts per expert drawn from a Dirichlet(0.5): a few hot experts, some nearly idle."""
    g = torch.Generator().manual_seed(seed)
    shares = torch._standard_gamma(torch.full((experts,), 0.5), generator=g)
    return [int(x) for x in (shares / shares.sum() * tokens).tolist()]


def _m_case(experts, tokens, n, k, baseline: str) -> Case:
    def setup():
        counts = _skewed_counts(experts, tokens, experts + tokens)
        offs, rows = _psum(counts)
        a, b = torch.randn(rows, k).bfloat16(), torch.randn(experts, n, k).bfloat16()
        ends = offs.tolist()

        def loop():
            out, start = torch.empty(rows, n, dtype=torch.bfloat16), 0
            for e, end in enumerate(ends):
                out[start:end] = torch.mm(a[start:end], b[e].T)
                start = end
            return out

        bases = {
            "loop": loop,
            "grouped_mm": lambda: torch._grouped_mm(a, b.transpose(1, 2), offs=offs),
            # the grouping's cost: the same rows through one weight, our dense kernel (as fast as torch.mm where the
            # CPU has BF16 dot products; BF16 torch.mm is emulated, far slower, where it has not)
            "dense": lambda: bf16_gemm(a, b[0]),
        }
        return (lambda: m_grouped_bf16_gemm(a, b, offs)), bases[baseline]

    name = {"loop": "per-expert torch.mm loop bf16", "grouped_mm": "torch._grouped_mm bf16"}.get(
        baseline, "one dense bf16_gemm of the same rows"
    )
    return Case(f"m_grouped E{experts} T{tokens} N{n} K{k}", 2 * tokens * n * k, setup, name)


def _k_case(experts, tokens, m, n, fp32: bool = False) -> Case:
    """The weight gradient: BF16 out (the default), or FP32 (DeepGEMM's contract for the FP32 accumulator of a
    training step) against a loop over FP32 upcasts, the FP32 result a CPU GEMM can give."""

    def setup():
        offs, rows = _psum(_skewed_counts(experts, tokens, experts * 3))
        dy, x = torch.randn(rows, m).bfloat16(), torch.randn(rows, n).bfloat16()
        ends = offs.tolist()
        out_dtype = torch.float32 if fp32 else torch.bfloat16

        def loop():
            out, start = torch.empty(experts, m, n, dtype=out_dtype), 0
            for e, end in enumerate(ends):
                if fp32:
                    out[e] = torch.mm(dy[start:end].T.float(), x[start:end].float())
                else:
                    out[e] = torch.mm(dy[start:end].T, x[start:end])
                start = end
            return out

        return (lambda: k_grouped_bf16_gemm(dy, x, offs, experts, out_dtype=out_dtype)), loop

    out = "FP32" if fp32 else "BF16"
    baseline = "per-expert FP32 upcast + torch.mm loop" if fp32 else "per-expert torch.mm loop bf16"
    return Case(f"k_grouped (wgrad) {out} out E{experts} T{tokens} M{m} N{n}", 2 * tokens * m * n, setup, baseline)


def _permute_case(tokens, hidden, topk, experts) -> Case:
    def setup():
        g = torch.Generator().manual_seed(1)
        x = torch.randn(tokens, hidden).bfloat16()
        idx = torch.rand(tokens, experts, generator=g).topk(topk, dim=1).indices
        return (lambda: moe_permute(x, idx, experts)), (lambda: torch_routing.moe_permute(x, idx, experts))

    return Case(f"moe_permute T{tokens} H{hidden} k{topk} E{experts}", 0, setup, "torch sort + index copy")


def _unpermute_case(tokens, hidden, topk, experts) -> Case:
    """The combine: our C++ kernel against the same slot-order sums as torch ops compiled by Inductor (what a
    decomposition of the op would run; bit for bit the same result)."""

    def setup():
        g = torch.Generator().manual_seed(2)
        idx = torch.rand(tokens, experts, generator=g).topk(topk, dim=1).indices
        y, row_map, _ = moe_permute(torch.randn(tokens, hidden, generator=g).bfloat16(), idx, experts)
        w = torch.rand(tokens, topk, generator=g)
        compiled = torch.compile(torch_routing.moe_unpermute.__wrapped__, dynamic=False)
        return (lambda: moe_unpermute(y, row_map, w)), (lambda: compiled(y, row_map, w))

    return Case(f"moe_unpermute T{tokens} H{hidden} k{topk} E{experts}", 0, setup, "torch ops, Inductor")


def cases(quick: bool = False) -> list[Case]:
    if quick:
        return [_m_case(8, 128, 256, 256, "loop"), _k_case(8, 128, 128, 256), _permute_case(64, 256, 2, 8)]
    return [
        _m_case(16, 2048, 1408, 2048, "loop"),
        _m_case(16, 2048, 1408, 2048, "grouped_mm"),
        _m_case(64, 256, 1408, 2048, "loop"),
        _m_case(64, 256, 1408, 2048, "grouped_mm"),
        # many small experts (DeepSeek-V3's 256): ~16 rows each, skewed (issue 51)
        _m_case(256, 4096, 1024, 1024, "grouped_mm"),
        _m_case(256, 4096, 1024, 1024, "dense"),
        _k_case(16, 2048, 1408, 2048),
        _k_case(16, 2048, 1408, 2048, fp32=True),
        _permute_case(4096, 2048, 8, 64),
        _unpermute_case(4096, 2048, 8, 64),
    ]
