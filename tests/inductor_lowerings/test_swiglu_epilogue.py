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
from tests.inductor_lowerings.graphs import Recorder, compiled, compiled_training
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


# ---- training graphs: enable(recompute_l1=True) tags the L1 GEMM and the chain for recomputation in the backward --


def _training_inputs(dtype=torch.bfloat16, weights_grad=False):
    a, w1, w2, offs, w = _inputs(dtype)
    return a.requires_grad_(), w1.requires_grad_(), w2.requires_grad_(), offs, w.requires_grad_(weights_grad)


def _weighted_fp32(a, w1, w2, offs, w):
    """The routing weight inside the epilogue (its gradient needs silu(gate) * up in the backward)."""
    gate, up = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    act = (F.silu(gate.float()) * up.float() * w[:, None]).bfloat16()
    return m_grouped_bf16_gemm(act, w2, offs)


def _l1_shaped(values, rows, inter):
    return [tuple(v.shape) for v in values if isinstance(v, torch.Tensor) and tuple(v.shape) == (rows, 2 * inter)]


def test_training_golden_graphs():
    """The forward runs the fused op and keeps only its output and the L1 operands; the backward recomputes the L1
    GEMM and the SwiGLU's steps from them. Without recompute_l1 the forward keeps the L1 output (no rewrite)."""
    args = _training_inputs()
    _, _, plain = compiled_training(_experts, *args, passes=True)
    assert "swiglu" not in plain.graphs[0] and _l1_shaped(plain.outputs[0], 44, 48), plain.graphs[0]
    _, _, rec = compiled_training(_experts, *args, passes=True, recompute_l1=True)
    forward, backward = rec.graphs
    assert not _l1_shaped(rec.outputs[0], 44, 48), rec.outputs[0]
    assert_expected_inline(
        forward,
        """\
m_grouped_bf16_gemm_swiglu_default = m_grouped_bf16_gemm_swiglu(primals_1, primals_2, primals_3, True, 1, None, None, 0, False, torch.bfloat16)
getitem_2 = getitem(m_grouped_bf16_gemm_swiglu_default, 0)
m_grouped_bf16_gemm_1 = m_grouped_bf16_gemm(getitem_2, primals_4, primals_3)
permute = aten.permute(primals_4, [0, 2, 1])""",
    )
    assert_expected_inline(
        backward,
        """\
m_grouped_bf16_gemm_2 = m_grouped_bf16_gemm(tangents_1, permute, primals_3, True, 1, torch.bfloat16)
k_grouped_bf16_gemm = k_grouped_bf16_gemm(tangents_1, mul, primals_3, 4, True, 1, None, torch.bfloat16)
m_grouped_bf16_gemm = m_grouped_bf16_gemm(primals_1, primals_2, primals_3)
split = aten.split.Tensor(m_grouped_bf16_gemm, 48, -1)
getitem = getitem(split, 0)
getitem_1 = getitem(split, 1)
convert_element_type = prims.convert_element_type(getitem, torch.float32)
neg = aten.neg(convert_element_type)
exp = aten.exp(neg)
add = aten.add.Tensor(exp, 1)
div = aten.div.Tensor(convert_element_type, add)
convert_element_type_1 = prims.convert_element_type(div, torch.bfloat16)
mul_1 = aten.mul.Tensor(m_grouped_bf16_gemm_2, convert_element_type_1)
mul_2 = aten.mul.Tensor(m_grouped_bf16_gemm_2, getitem_1)
convert_element_type_2 = prims.convert_element_type(mul_2, torch.float32)
sigmoid = aten.sigmoid(convert_element_type)
mul_3 = aten.mul.Tensor(convert_element_type_2, sigmoid)
sub = aten.sub.Tensor(1, sigmoid)
mul_4 = aten.mul.Tensor(convert_element_type, sub)
add_1 = aten.add.Tensor(mul_4, 1)
mul_5 = aten.mul.Tensor(mul_3, add_1)
convert_element_type_4 = prims.convert_element_type(mul_5, torch.bfloat16)
cat = aten.cat([convert_element_type_4, mul_1], 1)
permute_1 = aten.permute(primals_2, [0, 2, 1])
m_grouped_bf16_gemm_3 = m_grouped_bf16_gemm(cat, permute_1, primals_3, True, 1, torch.bfloat16)
k_grouped_bf16_gemm_1 = k_grouped_bf16_gemm(cat, primals_1, primals_3, 4, True, 1, None, torch.bfloat16)""",
    )


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
@pytest.mark.parametrize(
    ("fn", "dtype"),
    [(_experts, torch.bfloat16), (_experts, torch.float32), (_weighted_fp32, torch.bfloat16)],
    ids=["bf16", "fp32", "weighted"],
)
def test_training_with_recompute_within_thresholds(fn, dtype, dynamic):
    """Outputs and every gradient (routing weights' included) of the recomputing compile within the op's thresholds
    of the compile without passes and of FP64 autograd."""
    args = _training_inputs(dtype, weights_grad=fn is _weighted_fp32)
    before = dict(inductor_lowerings.MATCHES)
    got, got_grads, rec = compiled_training(fn, *args, passes=True, recompute_l1=True, dynamic=dynamic)
    assert "m_grouped_bf16_gemm_swiglu" in rec.graphs[0], rec.graphs[0]
    assert "m_grouped_bf16_gemm_swiglu" not in rec.graphs[1], rec.graphs[1]
    assert inductor_lowerings.MATCHES["recompute_l1"] > before.get("recompute_l1", 0)
    want, want_grads, _ = compiled_training(fn, *args, passes=False, dynamic=dynamic)
    wide = [x.detach().double().requires_grad_(x.requires_grad) if x.is_floating_point() else x for x in args]
    if fn is _weighted_fp32:  # its casts are the BF16 model's: FP64 throughout for the reference
        ref = m_grouped_bf16_gemm(_fp64_weighted_act(*wide), wide[2], wide[3])
    else:
        ref = fn(*wide)
    ref.square().sum().backward()
    ref_grads = [x.grad for x in wide if x.requires_grad]
    assert len(got_grads) == len(want_grads) == len(ref_grads) == 3 + (fn is _weighted_fp32)
    for g, w, r in zip([got, *got_grads], [want, *want_grads], [ref, *ref_grads], strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert (
            calc_diff(g, w) < THRESHOLDS[dtype] and calc_diff(g, r) < _CHAIN[dtype] and calc_diff(w, r) < _CHAIN[dtype]
        )


# The expert MLP and its backward against FP64 autograd: in BF16 a chain of roundings (h, silu, the product, each
# GEMM's output and the gradients'), each within the op's threshold, adds up past it.
_CHAIN = {torch.bfloat16: 1e-4, torch.float32: 1e-10}


def _fp64_weighted_act(a, w1, w2, offs, w):
    gate, up = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    return F.silu(gate) * up * w[:, None]


def _h_returned(a, w1, w2, offs, w):
    h = m_grouped_bf16_gemm(a, w1, offs)
    gate, up = h.chunk(2, dim=-1)
    return m_grouped_bf16_gemm(F.silu(gate) * up, w2, offs), h


def _gate_used_in_forward(a, w1, w2, offs, w):
    gate, up = m_grouped_bf16_gemm(a, w1, offs).chunk(2, dim=-1)
    return m_grouped_bf16_gemm(F.silu(gate) * up, w2, offs) + gate.sum()


def _gelu_experts(a, w1, w2, offs, w):
    return m_grouped_bf16_gemm(_gelu(a, w1, w2, offs, w), w2, offs)


@pytest.mark.parametrize("fn", [_h_returned, _gate_used_in_forward, _gelu_experts], ids=lambda f: f.__name__)
def test_training_near_misses_are_not_tagged(fn):
    """A chain whose steps the forward needs anyway (or that is no SwiGLU) is not tagged: the graphs and the results
    are those of the compile without recompute_l1."""
    args = _training_inputs()
    before = inductor_lowerings.MATCHES["recompute_l1"]
    got, got_grads, rec = compiled_training(fn, *args, passes=True, recompute_l1=True)
    assert inductor_lowerings.MATCHES["recompute_l1"] == before and "swiglu" not in rec.graphs[0], rec.graphs[0]
    want, want_grads, plain = compiled_training(fn, *args, passes=True)
    assert rec.graphs == plain.graphs
    for g, w in zip(
        [*(got if isinstance(got, tuple) else (got,)), *got_grads],
        [*(want if isinstance(want, tuple) else (want,)), *want_grads],
    ):
        assert torch.equal(g, w)


def test_recompute_l1_is_opt_in_and_composes_with_a_users_joint_pass():
    """enable() alone installs no joint pass; enable(recompute_l1=True) chains the user's, enable() / disable() and
    the context manager put it back; the joint pass's uuid covers ours and the user's."""
    from torch_ascend_moe.inductor_lowerings._pass import AscendMoEJointPasses

    user = Recorder()
    with config.patch(joint_custom_post_pass=user):
        with inductor_lowerings.enabled():
            assert config.joint_custom_post_pass is user and not inductor_lowerings.recomputes_l1()
        with inductor_lowerings.enabled(recompute_l1=True):
            ours = config.joint_custom_post_pass
            assert isinstance(ours, AscendMoEJointPasses) and ours.user is user and inductor_lowerings.recomputes_l1()
            assert ours.uuid() is None  # the user's pass has no uuid: the cache is bypassed, as without us
            inductor_lowerings.enable()
            assert config.joint_custom_post_pass is user
        assert config.joint_custom_post_pass is user and not inductor_lowerings.is_enabled()
        args = _training_inputs()
        _, _, rec = compiled_training(_experts, *args, passes=True, recompute_l1=True)
        assert len(user.graphs) == 1 and "m_grouped_bf16_gemm_swiglu" in rec.graphs[0]  # ours ran, then the user's
    assert AscendMoEJointPasses().uuid() is not None


def test_training_cache_hit_recomputes():
    """A second compile of the training graph hits the caches (the joint pass's uuid is stable) and runs the same
    fused forward and recomputing backward."""
    args = _training_inputs()
    with fresh_cache(), config.patch(fx_graph_cache=True), inductor_lowerings.enabled(recompute_l1=True):
        results = []
        for _ in range(2):
            torch._dynamo.reset()
            counters.clear()
            before = inductor_lowerings.MATCHES["recompute_l1"]
            leaves = [x.detach().requires_grad_(x.requires_grad) for x in args]
            out = torch.compile(_experts, fullgraph=True)(*leaves)
            out.float().square().sum().backward()
            tagged = inductor_lowerings.MATCHES["recompute_l1"] - before
            results.append((out, [x.grad for x in leaves[:3]], dict(counters["inductor"]), tagged))
    torch._dynamo.reset()
    (out0, grads0, ind0, tagged0), (out1, grads1, ind1, tagged1) = results
    # Both graphs (forward and backward) missed and then hit; the joint graph was not partitioned again.
    assert ind0.get("fxgraph_cache_miss") == 2 and tagged0 > 0, ind0
    assert ind1.get("fxgraph_cache_hit") == 2 and "fxgraph_cache_miss" not in ind1 and tagged1 == 0, ind1
    assert torch.equal(out0, out1) and all(torch.equal(g, h) for g, h in zip(grads0, grads1, strict=True))


def test_grouped_experts_training_fuses_with_recompute():
    """nn.GroupedExperts in training: its unfused steps become the fused op in the forward graph; gradients of the
    input, the routing weights and both weights within the op's thresholds of eager."""
    from torch_ascend_moe.nn import GroupedExperts

    torch.manual_seed(0)
    experts = GroupedExperts(4, 64, 32).bfloat16()
    x, idx, w = torch.randn(12, 64).bfloat16().requires_grad_(), torch.randint(0, 4, (12, 2)), torch.rand(12, 2)
    w.requires_grad_()
    eager = experts(x, idx, w)
    eager.float().square().sum().backward()
    want = [eager, x.grad, w.grad, *(p.grad for p in experts.parameters())]
    experts.zero_grad()
    got, grads, rec = compiled_training(experts, x, idx, w, passes=True, recompute_l1=True)
    assert "m_grouped_bf16_gemm_swiglu" in rec.graphs[0], rec.graphs[0]
    for g, e in zip([got, *grads, *(p.grad for p in experts.parameters())], want, strict=True):
        assert calc_diff(g, e) < THRESHOLDS[torch.bfloat16]


def test_backend_option_recomputes_for_one_model():
    """``torch.compile(backend="ascend_moe", options={"recompute_l1": True})``: the fused forward for that model, the
    global config untouched; Inductor's own options pass through."""
    args = _training_inputs()
    recorder = Recorder()
    torch._dynamo.reset()
    with config.patch(post_grad_custom_post_pass=recorder):
        leaves = [x.detach().requires_grad_(x.requires_grad) for x in args]
        options = {"recompute_l1": True, "max_autotune_gemm": False}
        compiled_fn = torch.compile(_experts, backend=inductor_lowerings.BACKEND, options=options)
        out = compiled_fn(*leaves)
        out.float().square().sum().backward()
        assert config.joint_custom_post_pass is None and not inductor_lowerings.is_enabled()
    torch._dynamo.reset()
    assert "m_grouped_bf16_gemm_swiglu" in recorder.graphs[0] and len(recorder.graphs) == 2, recorder.graphs
    _, grads, _ = compiled_training(_experts, *args, passes=False)
    assert all(calc_diff(x.grad, g) < THRESHOLDS[torch.bfloat16] for x, g in zip(leaves[:3], grads, strict=True))
