"""``bench compile``'s cases: each side computes the same values, and only "ours" is compiled with the rewrites (the
baseline's compile applies none), so the ratio the benchmark prints is the passes' effect and nothing else."""

from __future__ import annotations

import pytest
import torch
from torch._inductor.utils import fresh_cache

from tests.inductor_lowerings.graphs import assert_same
from torch_ascend_moe import bench, inductor_lowerings
from torch_ascend_moe.backends import cpu_gemm
from torch_ascend_moe.bench import compile as cases_module
from torch_ascend_moe.testing import calc_diff

# Rewrites per compile: the expert MLP's L1 GEMM + SwiGLU by swiglu_epilogue (nn.MoE's inference forward already calls
# the fused op itself: nothing left to rewrite); the same for the eager experts traced as our ops. BF16 dense and stock
# models depend on the CPU (backends.cpu_gemm): with BF16 dot products ATen's GEMMs are kept (grouped_mm experts keep
# _grouped_mm, BF16 eager experts are traced as transformers' grouped_mm experts: hf.eager_experts_forward); without,
# every BF16 mm / addmm becomes bf16_gemm (dense_gemm: a linear, a router, attention projections, the LM head) and
# each _grouped_mm ours (grouped_mm: two per MoE layer), the eager experts are traced as our ops (swiglu_epilogue).
# The first matching prefix counts.
REWRITTEN = {
    "FP8 linear": 1,
    "FP8 experts": 1,
    "RMSNorm + FP8 cast": 1,
    "indexer": 1,
    "MoE layer FP8": 3,  # the per-token cast inlined, the FP8 experts' L1 + SwiGLU + requant, the combine + residual
    "MoE layer BF16 inference": 2,  # the L1 + SwiGLU, the combine + residual
    # recompute_l1: the chain tagged in the joint graph, fused; and in the backward the permute's gradient (a combine)
    # plus the shared expert's input gradient folds into the combine (combine_residual), on every CPU
    "MoE layer BF16 fwd+bwd T64 H64, L1 recomputed": 3,
    "MoE layer": 0,
    "dense MLP": 0,
    "expert MLP": 1,
    "HF Mixtral block FP32 eager": 1,
    "HF": 0,
    "combine": 1,
}
REWRITTEN_WITHOUT_BF16_DOT = {
    "MoE layer FP8": 4,  # the router's mm too
    "MoE layer BF16 inference": 3,
    "dense MLP": 2,  # both linears
    "HF Mixtral block BF16 eager": 2,  # the router's mm, the L1 + SwiGLU
    "HF Mixtral block BF16": 4,  # the router's mm, two _grouped_mm, then the L1 (now ours) + SwiGLU
    "HF qwen3_moe tiny model 1-layer BF16": 9,  # q/k/v/o and the router's mm, two _grouped_mm, L1 + SwiGLU; LM head
    "HF qwen3_moe tiny model BF16": 17,  # the same per layer (2); the LM head
}


def expected_rewrites(name: str) -> int:
    tables = (REWRITTEN,) if cpu_gemm.native(torch.bfloat16) else (REWRITTEN_WITHOUT_BF16_DOT, REWRITTEN)
    return next(v for table in tables for k, v in table.items() if name.startswith(k))


@pytest.mark.parametrize("case", cases_module.cases(quick=True)[:-1], ids=lambda c: c.name.split(" (")[0])
def test_sides_agree_and_only_ours_is_rewritten(case):
    torch._dynamo.reset()
    ours, baseline = case.setup()
    before = inductor_lowerings.MATCHES.total()
    with fresh_cache():  # a cache hit would run no pass to count
        got = ours()
        rewrites = inductor_lowerings.MATCHES.total() - before
        want = baseline()
    assert inductor_lowerings.MATCHES.total() - before == rewrites  # the baseline compiled without them
    expected = expected_rewrites(case.name)
    if case.name.startswith("MoE layer BF16") and "inference" not in case.name and not cpu_gemm.native(torch.bfloat16):
        # Without BF16 dot products on this CPU the shared expert runs on our bf16_gemm (nn.moe._linear), and its sum
        # with the routed experts' combine folds into the combine (combine_residual); elsewhere it is nn.Linear's mm.
        # (Checked on both kinds of CPU, and here with backends.cpu_gemm.NATIVE patched either way.)
        expected += 1
    assert rewrites == expected, case.name
    if case.name.startswith("MoE") and got.dtype == torch.float32:
        torch.testing.assert_close(got, want)  # Inductor may order the dense epilogue's sums differently
    elif case.name.startswith("RMSNorm"):  # the cast of the norm's FP32 value vs of its BF16 rounding
        got, want = (q.double() * sf.repeat_interleave(128, dim=1) for q, sf in (got, want))
        assert calc_diff(got, want) < 1e-3
    elif case.name.startswith("HF Mixtral block BF16 eager"):  # (the FP32 one: the generic 1e-5 below)
        # HF's loop rounds each expert's output, its weighting and the index_add sums to BF16, ours once: each side
        # is 1.2e-5 from the FP64 block on this case.
        assert calc_diff(got, want) < 2e-5
    elif case.name.startswith(("combine", "MoE", "expert MLP", "HF", "dense")):
        assert calc_diff(got, want) < 1e-5  # one BF16 rounding instead of two
    else:
        assert_same(got, want)
    torch._dynamo.reset()


def test_gemm_share_bounds_what_a_fusion_can_gain():
    """The bound column: the share of a baseline's time in ATen's GEMMs (their own time) and Amdahl's bound on the
    speedup of removing everything else."""
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    x = torch.randn(1 << 20)
    assert bench.gemm_share(lambda: torch.mm(a, b)) > 0.5  # the profiler's own overhead is what is not the mm
    assert bench.gemm_share(lambda: (x * 2).exp().sum()) == 0
    mixed = bench.gemm_share(lambda: (torch.mm(a, b), (x * 2).exp().sum()))
    assert 0 < mixed < 1
    result = bench.Result("c", "b", 1.0, 2.0, 0.0, 0.0, baseline_gemm_share=0.75)
    assert result.bound == pytest.approx(4 / 3)  # the GEMMs' 75 % stay
    assert bench.Result("c", "b", 1.0, 2.0, 0.0, 0.0).bound is None
