"""The quant_gemm rewrite (inductor_lowerings/quant_gemm.py): ``quantize_fp8(x, [1, g])`` → ``fp8_gemm`` becomes one
``fp8_quant_gemm``, and → ``m_grouped_fp8_gemm`` one ``m_grouped_fp8_quant_gemm``. The post-grad graphs before and
after (golden), the compiled outputs bit for bit the unrewritten ones over recipes, scale formats, ``c``, ``alpha``,
layouts and output dtypes (static and dynamic shapes), and the near misses left alone."""

from __future__ import annotations

import pytest
import torch
from expecttest import assert_expected_inline

from tests.inductor_lowerings.graphs import assert_same, compiled
from torch_ascend_moe import inductor_lowerings

ops = torch.ops.ascend_moe


def _weights(n=64, k=256, recipe=(128, 128), ue8m0=False, seed=0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    return ops.quantize_fp8(w, list(recipe), ue8m0)


def _linear(block=(1, 128), ue8m0=False, packed=False, recipe_a=None, **gemm):
    def fn(x, b, sfb, *c):
        data, sf = ops.quantize_fp8(x, list(block), ue8m0, packed)
        return ops.fp8_gemm(data, sf, b, sfb, c[0] if c else None, list(recipe_a or block), **gemm)

    return fn


def test_golden_graph():
    x, (b, sfb) = torch.randn(8, 256), _weights()
    _, before = compiled(_linear(), x, b, sfb, passes=False)
    _, after = compiled(_linear(), x, b, sfb, passes=True)
    assert_expected_inline(
        before,
        """\
quantize_fp8 = quantize_fp8(arg0_1)
getitem = getitem(quantize_fp8, 0)
getitem_1 = getitem(quantize_fp8, 1)
fp8_gemm = fp8_gemm(getitem, getitem_1, arg1_1, arg2_1)""",
    )
    assert_expected_inline(
        after,
        """fp8_quant_gemm_default = fp8_quant_gemm(arg0_1, arg1_1, arg2_1, None, 128, [128, 128], False, 1.0, torch.bfloat16)""",
    )


CASES = {
    "1x128 fp32 scales": ({}, {}, torch.float32, None),
    "1x128 ue8m0, bf16 x": ({"ue8m0": True}, {}, torch.bfloat16, None),
    "1x32 ue8m0, MX weights": ({"block": (1, 32), "ue8m0": True}, {"recipe_b": [1, 32]}, torch.bfloat16, (1, 32)),
    "1x64, c and alpha, fp32 out": ({"block": (1, 64)}, {"alpha": 0.5, "out_dtype": torch.float32}, torch.float32, "c"),
    "bf16 out from fp32 x": ({}, {"out_dtype": torch.bfloat16}, torch.float32, None),
}


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_rewritten_equals_unrewritten(case, dynamic):
    cast, gemm, dtype, extra = CASES[case]
    recipe = extra if isinstance(extra, tuple) else (128, 128)
    x = (torch.randn(19, 256, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    x[2, 7] = float("nan")  # a NaN block: its row is NaN in both
    b, sfb = _weights(recipe=recipe, ue8m0=cast.get("ue8m0", False))
    args = (x, b, sfb) + ((torch.randn(19, 64),) if extra == "c" else ())
    fn = _linear(**cast, **gemm)
    before = inductor_lowerings.MATCHES["quant_gemm"]
    got, graph = compiled(fn, *args, passes=True, dynamic=dynamic)
    assert "fp8_quant_gemm" in graph and "quantize_fp8" not in graph
    assert inductor_lowerings.MATCHES["quant_gemm"] > before
    assert_same(got, fn(*args))


def _cast_reused(x, b, sfb):
    data, sf = ops.quantize_fp8(x, [1, 128])
    return ops.fp8_gemm(data, sf, b, sfb), data.view(torch.uint8)


def _cast_is_the_weight(x, b, sfb):
    data, sf = ops.quantize_fp8(x, [1, 128])  # the cast feeds B (per-row weight scales), not A
    return ops.fp8_gemm(b, sfb, data, sf, recipe_a=[128, 128], recipe_b=[1, 128])


def _scales_from_elsewhere(x, b, sfb):
    data, sf = ops.quantize_fp8(x, [1, 128])
    _, sf2 = ops.quantize_fp8(x * 2, [1, 128])
    return ops.fp8_gemm(data, sf2, b, sfb)


NEAR_MISSES = {
    "block cast (128x128)": (_linear(block=(128, 128)), torch.float32),
    "the cast is the B operand": (_cast_is_the_weight, torch.float32),
    "cast outputs used elsewhere": (_cast_reused, torch.float32),
    "scales of another cast": (_scales_from_elsewhere, torch.float32),
    "fp16 x (fp8_quant_gemm takes BF16/FP32)": (_linear(), torch.float16),
}


@pytest.mark.parametrize("name", NEAR_MISSES, ids=str)
def test_near_misses_are_left_alone(name):
    fn, dtype = NEAR_MISSES[name]
    x, (b, sfb) = torch.randn(128, 256).to(dtype), _weights()
    got, graph = compiled(fn, x, b, sfb, passes=True)
    assert "fp8_quant_gemm" not in graph, graph
    assert_same(got, fn(x, b, sfb))


def _experts(groups=3, n=48, k=256, fmt=("fp8-block", 128, 128, False), seed=0):
    from tests.grouped.specs import _quantize_experts

    w = torch.randn(groups, n, k, generator=torch.Generator().manual_seed(seed))
    return _quantize_experts(w, fmt)


def _grouped(block=(1, 128), ue8m0=False, recipe_a=None, **gemm):
    def fn(x, b, sfb, layout):
        data, sf = ops.quantize_fp8(x, list(block), ue8m0)
        return ops.m_grouped_fp8_gemm(data, sf, b, sfb, layout, recipe_a=list(recipe_a or block), **gemm)

    return fn


def _layout():
    return torch.tensor([5, 5, 19], dtype=torch.int32)  # an empty expert in the middle


def test_golden_graph_grouped():
    x, (b, sfb, _), layout = torch.randn(19, 256), _experts(), _layout()
    _, before = compiled(_grouped(), x, b, sfb, layout, passes=False)
    _, after = compiled(_grouped(), x, b, sfb, layout, passes=True)
    assert_expected_inline(
        before,
        """\
quantize_fp8 = quantize_fp8(arg0_1)
getitem = getitem(quantize_fp8, 0)
getitem_1 = getitem(quantize_fp8, 1)
m_grouped_fp8_gemm = m_grouped_fp8_gemm(getitem, getitem_1, arg1_1, arg2_1, arg3_1)""",
    )
    assert_expected_inline(
        after,
        """m_grouped_fp8_quant_gemm_default = m_grouped_fp8_quant_gemm(arg0_1, arg1_1, arg2_1, arg3_1, True, 1, 128, [128, 128], False, torch.bfloat16)""",
    )


GROUPED_CASES = {
    "1x128 fp32 scales, psum": ({}, {}, torch.float32, ("fp8-block", 128, 128, False), True),
    "1x128 ue8m0, bf16 x, ids": ({"ue8m0": True}, {}, torch.bfloat16, ("fp8-token", 1, 128, True), False),
    "1x32 ue8m0, FP4 experts": ({"block": (1, 32), "ue8m0": True}, {}, torch.bfloat16, ("fp4", 1, 32, True), True),
    "1x64, fp32 out, aligned": (
        {"block": (1, 64)},
        {"out_dtype": torch.float32, "alignment": 4},
        torch.float32,
        None,
        True,
    ),
}


@pytest.mark.parametrize("case", GROUPED_CASES, ids=str)
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_grouped_rewritten_equals_unrewritten(case, dynamic):
    cast, gemm, dtype, fmt, psum = GROUPED_CASES[case]
    b, sfb, recipe_b = _experts(fmt=fmt or ("fp8-block", 128, 128, False))
    x = (torch.randn(21, 256, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    x[2, 7] = float("nan")  # a NaN block: its row is NaN in both
    if psum:
        layout = torch.tensor([5, 5, 19] if gemm.get("alignment", 1) == 1 else [5, 8, 19], dtype=torch.int32)
        x[19:] = float("inf")  # rows no expert owns: never read by either graph
    else:
        layout = torch.tensor([0] * 4 + [-1] * 3 + [2] * 9 + [1] * 5, dtype=torch.int32)
        x[4:7] = float("inf")
    fn = _grouped(**cast, recipe_b=recipe_b, psum=psum, **gemm)
    before = inductor_lowerings.MATCHES["quant_gemm"]
    got, graph = compiled(fn, x, b, sfb, layout, passes=True, dynamic=dynamic)
    assert "m_grouped_fp8_quant_gemm" in graph and "quantize_fp8" not in graph, graph
    assert inductor_lowerings.MATCHES["quant_gemm"] > before
    assert_same(got, fn(x, b, sfb, layout))


def _grouped_cast_reused(x, b, sfb, layout):
    data, sf = ops.quantize_fp8(x, [1, 128])
    return ops.m_grouped_fp8_gemm(data, sf, b, sfb, layout), sf * 2


def _grouped_scales_from_elsewhere(x, b, sfb, layout):
    data, _ = ops.quantize_fp8(x, [1, 128])
    _, sf = ops.quantize_fp8(x * 2, [1, 128])
    return ops.m_grouped_fp8_gemm(data, sf, b, sfb, layout)


GROUPED_NEAR_MISSES = {
    "scales of another cast": (_grouped_scales_from_elsewhere, torch.float32),
    "cast outputs used elsewhere": (_grouped_cast_reused, torch.float32),
    "fp16 x": (_grouped(), torch.float16),
}


@pytest.mark.parametrize("name", GROUPED_NEAR_MISSES, ids=str)
def test_grouped_near_misses_are_left_alone(name):
    fn, dtype = GROUPED_NEAR_MISSES[name]
    x, (b, sfb, _), layout = torch.randn(19, 256).to(dtype), _experts(), _layout()
    got, graph = compiled(fn, x, b, sfb, layout, passes=True)
    assert "m_grouped_fp8_quant_gemm" not in graph, graph
    assert_same(got, fn(x, b, sfb, layout))


def test_the_swiglu_requant_is_left_to_swiglu_epilogue():
    """An FP8 expert MLP: the requant closing the SwiGLU feeds L2, but ``swiglu_epilogue`` fuses it into L1 (no FP32
    activation in memory), so L2 stays ``m_grouped_fp8_gemm``; the first cast feeds the fused L1 and is inlined."""
    from torch_ascend_moe.testing import calc_diff

    (b1, sfb1, _), (b2, sfb2, _) = _experts(n=256, seed=1), _experts(n=256, k=128, seed=2)

    def mlp(x, layout):
        h = ops.m_grouped_fp8_gemm(*ops.quantize_fp8(x, [1, 128]), b1, sfb1, layout)
        gate, up = h.split(h.shape[1] // 2, dim=-1)
        data, sf = ops.quantize_fp8(torch.nn.functional.silu(gate.float()) * up.float(), [1, 128])
        return ops.m_grouped_fp8_gemm(data, sf, b2, sfb2, layout)

    x, layout = torch.randn(19, 256), _layout()
    got, graph = compiled(mlp, x, layout, passes=True)
    assert "m_grouped_fp8_gemm_swiglu" in graph and "m_grouped_fp8_quant_gemm" not in graph, graph
    assert "m_grouped_fp8_gemm(" in graph, graph
    assert calc_diff(got, mlp(x, layout)) < 1e-4
