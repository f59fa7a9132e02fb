"""The swiglu_epilogue rewrite (inductor_lowerings/swiglu_epilogue.py): L1 grouped GEMM -> SwiGLU (-> x routing weight)
(-> cast | per-token FP8 requant) becomes ``m_grouped_bf16_gemm_swiglu`` (``m_grouped_fp8_gemm_swiglu`` after a scaled L1). Golden graphs (the BF16 expert MLP as
``nn.GroupedExperts`` writes it; the FP32 epilogue with clamp, weights and requant as ``mega_moe`` does), outputs of
the rewritten compile within the op's thresholds of the unrewritten compile and of fp64, the module itself, the FX
graph cache, and near misses left alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from expecttest import assert_expected_inline
from torch._dynamo.utils import counters
from torch._inductor import config
from torch._inductor.utils import fresh_cache

from tests.fp8_gemm.specs import quantize
from tests.grouped.specs import psum_layout, swiglu_reference
from tests.inductor_lowerings.graphs import compiled
from torch_ascend_moe import inductor_lowerings
from torch_ascend_moe.ops.grouped import m_grouped_bf16_gemm, m_grouped_fp8_gemm
from torch_ascend_moe.quant import per_token_cast_to_fp8
from torch_ascend_moe.testing import calc_diff
from torch_ascend_moe.testing.harness import THRESHOLDS


def _inputs(dtype=torch.bfloat16, counts=(5, 0, 30, 9), k=64, inter=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    offs, rows = psum_layout(list(counts), 1)
    a = torch.randn(rows, k, generator=g).to(dtype)
    w1 = (torch.randn(len(counts), 2 * inter, k, generator=g) / k**0.5).to(dtype)
    w2 = (torch.randn(len(counts), k, inter, generator=g) / inter**0.5).to(dtype)
    return a, w1, w2, offs, torch.rand(rows, generator=g)


def _experts(a, w1, w2, offs, w):
    """nn.GroupedExperts' expert MLP: SwiGLU in the model's dtype."""
    gate, up = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    return m_grouped_bf16_gemm(F.silu(gate) * up, w2, offs)


def _fp32_epilogue(a, w1, w2, offs, w, clamp=2.0):
    """mega_moe's steps: FP32 epilogue with clamp and routing weight, then the per-token FP8 requant."""
    gate, up = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    gate, up = gate.clamp(max=clamp), up.clamp(-clamp, clamp)
    act = F.silu(gate.float()) * up.float() * w.unsqueeze(1)
    return per_token_cast_to_fp8(act, use_ue8m0=True, gran_k=16)


def _weighted_bf16(a, w1, w2, offs, w):
    gate, up = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    return (gate.float() * torch.sigmoid(gate.float()) * up.float() * w[:, None]).bfloat16()


def test_golden_graphs():
    args = _inputs()
    _, before = compiled(_experts, *args, passes=False)
    _, after = compiled(_experts, *args, passes=True)
    assert_expected_inline(
        before,
        """\
m_grouped_bf16_gemm = m_grouped_bf16_gemm(arg0_1, arg1_1, arg2_1)
split = aten.split.Tensor(m_grouped_bf16_gemm, 48, -1)
getitem = getitem(split, 0)
getitem_1 = getitem(split, 1)
convert_element_type = prims.convert_element_type(getitem, torch.float32)
neg = aten.neg(convert_element_type)
exp = aten.exp(neg)
add = aten.add.Tensor(exp, 1)
div = aten.div.Tensor(convert_element_type, add)
convert_element_type_1 = prims.convert_element_type(div, torch.bfloat16)
mul = aten.mul.Tensor(convert_element_type_1, getitem_1)
m_grouped_bf16_gemm_1 = m_grouped_bf16_gemm(mul, arg3_1, arg2_1)""",
    )
    assert_expected_inline(
        after,
        """\
m_grouped_bf16_gemm_swiglu_default = m_grouped_bf16_gemm_swiglu(arg0_1, arg1_1, arg2_1, True, 1, None, None, 0, False, torch.bfloat16)
getitem_2 = getitem(m_grouped_bf16_gemm_swiglu_default, 0)
m_grouped_bf16_gemm_1 = m_grouped_bf16_gemm(getitem_2, arg3_1, arg2_1)""",
    )
    _, after = compiled(_fp32_epilogue, *args, passes=True)
    assert_expected_inline(
        after,
        """\
unsqueeze = aten.unsqueeze(arg3_1, 1)
view_default = aten.view(unsqueeze, [-1])
m_grouped_bf16_gemm_swiglu_default = m_grouped_bf16_gemm_swiglu(arg0_1, arg1_1, arg2_1, True, 1, view_default, 2.0, 16, True)
getitem_4 = getitem(m_grouped_bf16_gemm_swiglu_default, 0)
getitem_5 = getitem(m_grouped_bf16_gemm_swiglu_default, 1)""",
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_expert_mlp_within_thresholds(dtype, dynamic):
    args = _inputs(dtype)
    before = inductor_lowerings.MATCHES["swiglu_epilogue"]
    got, graph = compiled(_experts, *args, passes=True, dynamic=dynamic)
    assert "m_grouped_bf16_gemm_swiglu" in graph and inductor_lowerings.MATCHES["swiglu_epilogue"] > before, graph
    want, _ = compiled(_experts, *args, passes=False, dynamic=dynamic)
    a, w1, w2, offs, _ = args
    act, _ = swiglu_reference(a, w1, offs, True, 1, None, None, 0, False, None)
    ref = torch.zeros(a.shape[0], a.shape[1], dtype=torch.float64)
    begin = 0
    for e, end in enumerate(offs.tolist()):
        ref[begin:end] = act[begin:end] @ w2[e].double().T
        begin = end
    assert got.dtype == want.dtype == dtype
    assert calc_diff(got, want) < THRESHOLDS[dtype] and calc_diff(got, ref) < THRESHOLDS[dtype]


@pytest.mark.parametrize("fn", [_fp32_epilogue, _weighted_bf16], ids=lambda f: f.__name__)
def test_epilogue_forms_within_thresholds(fn):
    args = _inputs()
    before = inductor_lowerings.MATCHES["swiglu_epilogue"]
    got, graph = compiled(fn, *args, passes=True)
    assert inductor_lowerings.MATCHES["swiglu_epilogue"] == before + 1 and "aten.mul" not in graph, graph
    want, _ = compiled(fn, *args, passes=False)
    got, want = (tuple(x) if isinstance(x, tuple) else (x,) for x in (got, want))
    if len(got) == 2:  # FP8: compare the values the scales give back
        got, want = ((q.float() * s.repeat_interleave(16, dim=1),) for q, s in (got, want))
    assert calc_diff(got[0], want[0]) < THRESHOLDS[torch.bfloat16]


def test_grouped_experts_calls_the_fused_op_in_inference():
    """nn.GroupedExperts takes the fused op itself without autograd (eager and compiled: nothing left to rewrite) and
    the unfused steps in training (their L1 output serves the backward); both agree within the op's thresholds."""
    from torch_ascend_moe.nn import GroupedExperts

    torch.manual_seed(0)
    experts = GroupedExperts(4, 64, 32).bfloat16()
    x, idx, w = torch.randn(12, 64).bfloat16(), torch.randint(0, 4, (12, 2)), torch.rand(12, 2)
    training = experts(x, idx, w)
    before = inductor_lowerings.MATCHES["swiglu_epilogue"]
    with torch.no_grad():
        eager = experts(x, idx, w)
        got, graph = compiled(experts, x, idx, w, passes=True)
    assert "m_grouped_bf16_gemm_swiglu" in graph and "aten.exp" not in graph, graph
    assert inductor_lowerings.MATCHES["swiglu_epilogue"] == before
    assert torch.equal(got, eager) and calc_diff(eager, training) < THRESHOLDS[torch.bfloat16]


def test_fx_graph_cache_hit_runs_the_fused_op():
    args = _inputs()
    with fresh_cache(), config.patch(fx_graph_cache=True), inductor_lowerings.enabled():
        results = []
        for _ in range(2):
            torch._dynamo.reset()
            counters.clear()
            results.append(torch.compile(_experts, fullgraph=True)(*args))
            results.append(dict(counters["inductor"]))
    torch._dynamo.reset()
    assert results[1].get("fxgraph_cache_miss") == 1 and results[3].get("fxgraph_cache_hit") == 1, results
    assert torch.equal(results[0], results[2])


def _h_used_twice(a, w1, w2, offs, w):
    h = m_grouped_bf16_gemm(a, w1, offs)
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up, h.sum()


def _gelu(a, w1, w2, offs, w):
    gate, up = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    return F.gelu(gate) * up


def _swapped_halves(a, w1, w2, offs, w):
    up, gate = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    return F.silu(gate) * up


def _unequal_split(a, w1, w2, offs, w):
    gate, up = m_grouped_bf16_gemm(a, w1, offs).split([40, 56], dim=-1)
    return F.silu(gate[:, :40]) * up[:, :40]


def _bf16_weights(a, w1, w2, offs, w):
    gate, up = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    return F.silu(gate) * up * w.bfloat16()[:, None]


def _different_clamps(a, w1, w2, offs, w):
    gate, up = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    return F.silu(gate.float().clamp(max=1.0)) * up.float().clamp(-2.0, 2.0)


def _cast_before_requant(a, w1, w2, offs, w):
    gate, up = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    return per_token_cast_to_fp8((F.silu(gate.float()) * up.float()).bfloat16(), use_ue8m0=False, gran_k=16)


def _fp32_l1_output(a, w1, w2, offs, w):
    gate, up = m_grouped_bf16_gemm(a, w1, offs, out_dtype=torch.float32).chunk(2, dim=-1)
    return F.silu(gate) * up


@pytest.mark.parametrize(
    "fn",
    [
        _h_used_twice,
        _gelu,
        _swapped_halves,
        _unequal_split,
        _different_clamps,
        _fp32_l1_output,
    ],
    ids=lambda f: f.__name__,
)
def test_near_misses_are_left_alone(fn):
    args = _inputs()
    before = inductor_lowerings.MATCHES["swiglu_epilogue"]
    got, graph = compiled(fn, *args, passes=True)
    assert inductor_lowerings.MATCHES["swiglu_epilogue"] == before and "swiglu" not in graph, graph
    want, _ = compiled(fn, *args, passes=False)
    for x, y in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(x.float(), y.float())


@pytest.mark.parametrize(
    ("fn", "left"),
    [(_bf16_weights, "aten.mul"), (_cast_before_requant, "aten.amax")],  # the requant, inlined by quantize_inline
    ids=["bf16 weights", "cast before requant"],
)
def test_steps_the_op_does_not_take_stay_outside(fn, left):
    """BF16 routing weights (not the op's FP32 ones) and a BF16 rounding before the requant: the fused op takes the
    SwiGLU and its BF16 output, the step after it stays in the graph."""
    args = _inputs()
    before = inductor_lowerings.MATCHES["swiglu_epilogue"]
    got, graph = compiled(fn, *args, passes=True)
    assert inductor_lowerings.MATCHES["swiglu_epilogue"] == before + 1 and left in graph, graph
    want, _ = compiled(fn, *args, passes=False)
    got, want = (x if isinstance(x, tuple) else (x,) for x in (got, want))
    if len(got) == 2:
        got, want = ((q.float() * s.repeat_interleave(16, dim=1),) for q, s in (got, want))
    assert calc_diff(got[0], want[0]) < THRESHOLDS[torch.bfloat16]


# ---- a scaled L1 (FP8 inference experts): m_grouped_fp8_gemm -> SwiGLU -> requant becomes m_grouped_fp8_gemm_swiglu --


def _fp8_inputs(seed=0, counts=(5, 0, 30, 9), k=128, inter=64):
    """MegaMoE's FP8 x FP4 operands (1x32 UE8M0 scales) for the L1 and FP8 x FP4 for the L2."""
    g = torch.Generator().manual_seed(seed)
    offs, rows = psum_layout(list(counts), 1)
    a, sfa, _ = quantize(torch.randn(rows, k, generator=g), ("fp8-token", 1, 32, True))
    experts = [quantize(torch.randn(2 * inter, k, generator=g) / 4, ("fp4", 1, 32, True)) for _ in counts]
    w1, sf1 = torch.stack([e[0] for e in experts]), torch.stack([e[1] for e in experts])
    experts = [quantize(torch.randn(k, inter, generator=g) / 4, ("fp4", 1, 32, True)) for _ in counts]
    w2, sf2 = torch.stack([e[0] for e in experts]), torch.stack([e[1] for e in experts])
    return a, sfa, w1, sf1, w2, sf2, offs, torch.rand(rows, generator=g)


def _fp8_experts(a, sfa, w1, sf1, w2, sf2, offs, w, clamp=2.0):
    """mega_moe's FP8 steps 3-6 as separate ops: L1, FP32 SwiGLU with clamp and weight, 1x32 UE8M0 requant, L2."""
    recipe = {"recipe_a": (1, 32), "recipe_b": (1, 32)}
    gate, up = m_grouped_fp8_gemm(a, sfa, w1, sf1, offs, **recipe).chunk(2, dim=-1)
    gate, up = gate.clamp(max=clamp), up.clamp(-clamp, clamp)
    act, act_sf = per_token_cast_to_fp8(F.silu(gate.float()) * up.float() * w.unsqueeze(1), use_ue8m0=True, gran_k=32)
    return m_grouped_fp8_gemm(act, act_sf, w2, sf2, offs, **recipe)


def _fp8_plain(a, sfa, w1, sf1, w2, sf2, offs, w):
    """The BF16 output form (no requant): SwiGLU in the L1's BF16."""
    gate, up = m_grouped_fp8_gemm(a, sfa, w1, sf1, offs, recipe_a=(1, 32), recipe_b=(1, 32)).chunk(2, dim=-1)
    return F.silu(gate) * up


def _fp8_fp32_l1(a, sfa, w1, sf1, w2, sf2, offs, w):
    """An FP32 L1 output: the fused op rounds h to BF16, so this is a near miss."""
    h = m_grouped_fp8_gemm(a, sfa, w1, sf1, offs, recipe_a=(1, 32), recipe_b=(1, 32), out_dtype=torch.float32)
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up


def test_fp8_golden_graph():
    _, after = compiled(_fp8_experts, *_fp8_inputs(), passes=True)
    assert_expected_inline(
        after,
        """\
unsqueeze = aten.unsqueeze(arg5_1, 1)
view_default = aten.view(unsqueeze, [-1])
m_grouped_fp8_gemm_swiglu_default = m_grouped_fp8_gemm_swiglu(arg0_1, arg1_1, arg2_1, arg3_1, arg4_1, True, 1, [1, 32], [1, 32], view_default, 2.0, 32, True)
getitem_4 = getitem(m_grouped_fp8_gemm_swiglu_default, 0)
getitem_5 = getitem(m_grouped_fp8_gemm_swiglu_default, 1)
m_grouped_fp8_gemm_1 = m_grouped_fp8_gemm(getitem_4, getitem_5, arg6_1, arg7_1, arg4_1, True, 1, [1, 32], [1, 32])""",
    )


@pytest.mark.parametrize("fn", [_fp8_experts, _fp8_plain], ids=lambda f: f.__name__)
def test_fp8_rewrite_within_thresholds(fn):
    args = _fp8_inputs()
    before = inductor_lowerings.MATCHES["swiglu_epilogue"]
    got, graph = compiled(fn, *args, passes=True)
    assert "m_grouped_fp8_gemm_swiglu" in graph and inductor_lowerings.MATCHES["swiglu_epilogue"] == before + 1, graph
    want, _ = compiled(fn, *args, passes=False)
    assert got.dtype == want.dtype and calc_diff(got, want) < THRESHOLDS[torch.bfloat16]


def test_fp8_near_miss_is_left_alone():
    args = _fp8_inputs()
    before = inductor_lowerings.MATCHES["swiglu_epilogue"]
    got, graph = compiled(_fp8_fp32_l1, *args, passes=True)
    assert inductor_lowerings.MATCHES["swiglu_epilogue"] == before and "swiglu" not in graph, graph
    want, _ = compiled(_fp8_fp32_l1, *args, passes=False)
    assert torch.equal(got, want)
